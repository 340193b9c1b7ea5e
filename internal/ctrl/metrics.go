package ctrl

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// loopMetrics are the metrics every controller shares, one series per
// controller (label name or controller).
type loopMetrics struct {
	queues     queueMetrics
	reconciles *prometheus.CounterVec
	duration   *prometheus.HistogramVec
}

// passMetrics are one controller's series of loopMetrics, looked up
// once: a reconcile only counts and observes.
type passMetrics struct {
	succeeded, failed prometheus.Counter
	duration          prometheus.Observer
}

func (m *loopMetrics) of(name string) *passMetrics {
	if m == nil {
		return nil
	}
	return &passMetrics{
		succeeded: m.reconciles.WithLabelValues(name, "success"),
		failed:    m.reconciles.WithLabelValues(name, "error"),
		duration:  m.duration.WithLabelValues(name),
	}
}

func (p *passMetrics) observe(took time.Duration, err error) {
	if p == nil {
		return
	}
	if err != nil {
		p.failed.Inc()
	} else {
		p.succeeded.Inc()
	}
	p.duration.Observe(took.Seconds())
}

// metricsOf registers the shared metrics on reg, or finds them there:
// every controller of a process registers the same collectors.
func metricsOf(reg prometheus.Registerer) (*loopMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	// Seconds from 1 ms to about 16 s.
	seconds := prometheus.ExponentialBuckets(0.001, 2, 15)
	m := &loopMetrics{
		queues: queueMetrics{
			depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "flotilla_workqueue_depth", Help: "Keys waiting in a controller's work queue.",
			}, []string{"name"}),
			adds: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "flotilla_workqueue_adds_total", Help: "Keys added to a controller's work queue.",
			}, []string{"name"}),
			latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name: "flotilla_workqueue_queue_duration_seconds", Help: "How long a key waited in the queue before a worker took it.", Buckets: seconds,
			}, []string{"name"}),
			work: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name: "flotilla_workqueue_work_duration_seconds", Help: "How long a worker took over a key.", Buckets: seconds,
			}, []string{"name"}),
			unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "flotilla_workqueue_unfinished_work_seconds", Help: "Seconds of work under way and not finished, summed over the workers: a value that grows says a worker is stuck.",
			}, []string{"name"}),
			longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "flotilla_workqueue_longest_running_processor_seconds", Help: "Seconds the longest-running worker of a queue has been at its key.",
			}, []string{"name"}),
			retries: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "flotilla_workqueue_retries_total", Help: "Keys queued again after their backoff.",
			}, []string{"name"}),
		},
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_controller_reconciles_total", Help: "Reconciles of a controller, by result (success, error).",
		}, []string{"controller", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flotilla_controller_reconcile_seconds", Help: "How long a controller's reconcile of one key took.", Buckets: seconds,
		}, []string{"controller"}),
	}
	q := &m.queues
	return m, errors.Join(
		register(reg, &q.depth), register(reg, &q.adds), register(reg, &q.latency), register(reg, &q.work),
		register(reg, &q.unfinished), register(reg, &q.longest), register(reg, &q.retries),
		register(reg, &m.reconciles), register(reg, &m.duration))
}

// register registers *v on reg; if an equal collector is there already
// (another controller of the process registered it), *v becomes that one.
func register[T prometheus.Collector](reg prometheus.Registerer, v *T) error {
	err := reg.Register(*v)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			*v = existing
			return nil
		}
	}
	return err
}

// queueMetrics is client-go's work queue metrics provider over
// Prometheus vectors.
type queueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

var _ workqueue.MetricsProvider = queueMetrics{}

func (q queueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return q.depth.WithLabelValues(name)
}

func (q queueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return q.adds.WithLabelValues(name)
}

func (q queueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return q.latency.WithLabelValues(name)
}

func (q queueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return q.work.WithLabelValues(name)
}

func (q queueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return q.unfinished.WithLabelValues(name)
}

func (q queueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return q.longest.WithLabelValues(name)
}

func (q queueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return q.retries.WithLabelValues(name)
}

// Register registers every collector on reg (nil registers none) and
// returns what failed: a component's metrics constructor ends with it.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	errs := make([]error, 0, len(cs))
	for _, c := range cs {
		errs = append(errs, reg.Register(c))
	}
	return errors.Join(errs...)
}
