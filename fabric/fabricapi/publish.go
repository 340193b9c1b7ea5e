package fabricapi

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// FieldManager is the agent's field manager for what it applies here.
const FieldManager = "flotilla"

// Retries of a failed write, and how often the DaemonSet is applied again
// (an apply that changes nothing writes nothing; it puts back a DaemonSet
// someone deleted or edited).
const (
	retryMin         = 100 * time.Millisecond
	retryMax         = 10 * time.Second
	daemonSetRefresh = time.Minute
)

// Publisher is the agent's side: it writes the newest plan to the
// ConfigMap, coalescing changes that come while a write is under way, and
// keeps the fabric's DaemonSet applied.
type Publisher struct {
	client    kubeclient.Interface
	namespace string
	owner     string // the agent's Deployment
	log       *slog.Logger

	kick chan struct{}
	mu   sync.Mutex
	plan *Plan
	// published is closed once the first plan is written.
	published     chan struct{}
	publishedOnce sync.Once

	writes, failures prometheus.Counter
}

// NewPublisher returns a publisher for the agent whose Deployment is owner
// in namespace; metrics go to reg.
func NewPublisher(client kubeclient.Interface, namespace, owner string, log *slog.Logger, reg prometheus.Registerer) *Publisher {
	p := &Publisher{
		client: client, namespace: namespace, owner: owner, log: log,
		kick: make(chan struct{}, 1), published: make(chan struct{}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_fabric_plan_writes_total", Help: "Fabric plans written to the ConfigMap.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_fabric_plan_write_errors_total", Help: "Failed writes of the fabric plan or applies of its DaemonSet (retried).",
		}),
	}
	reg.MustRegister(p.writes, p.failures)
	return p
}

// Set makes plan the one to publish; it never blocks.
func (p *Publisher) Set(plan Plan) {
	p.mu.Lock()
	p.plan = &plan
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Published is closed once the first plan is written.
func (p *Publisher) Published() <-chan struct{} { return p.published }

// daemonSetAfterPlan is how long the DaemonSet's first apply waits for the
// first plan's write.
const daemonSetAfterPlan = 5 * time.Second

// Run writes plans and keeps the DaemonSet applied until ctx ends. The
// two are separate loops: a plan, which the workers' routes wait for, is
// never queued behind an apply of the DaemonSet, and the first apply
// waits for the first plan (daemonSetAfterPlan at most): a replica taking
// over finds the DaemonSet in place, and its plan is what the workers
// wait for.
func (p *Publisher) Run(ctx context.Context) error {
	var written []byte
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-p.published:
		case <-time.After(daemonSetAfterPlan):
		case <-ctx.Done():
			return
		}
		p.keep(ctx, "the fabric's DaemonSet", p.ApplyDaemonSet, nil, daemonSetRefresh)
	})
	p.keep(ctx, "the fabric plan", func(ctx context.Context) error { return p.publish(ctx, &written) }, p.kick, 0)
	wg.Wait()
	return nil
}

// keep calls write until ctx ends: again after every kick and every
// refresh (0: never), sooner with a backoff after a failure.
func (p *Publisher) keep(ctx context.Context, what string, write func(context.Context) error, kick <-chan struct{}, refresh time.Duration) {
	retry := retryMin
	var failing string // the error last logged: a repeated one is logged once
	for {
		var timer <-chan time.Time
		if err := write(ctx); err != nil {
			p.failures.Inc()
			if err.Error() != failing {
				p.log.Warn("cannot publish "+what+"; retrying with a backoff", "err", err)
				failing = err.Error()
			}
			timer = time.After(retry)
			retry = min(2*retry, retryMax)
		} else {
			if failing != "" {
				p.log.Info(what + " published again")
				failing = ""
			}
			retry = retryMin
			if refresh > 0 {
				timer = time.After(refresh)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-timer:
		}
	}
}

// publish writes the newest plan unless it is what was written last.
func (p *Publisher) publish(ctx context.Context, written *[]byte) error {
	p.mu.Lock()
	plan := p.plan
	p.mu.Unlock()
	if plan == nil {
		return nil
	}
	b, err := plan.Marshal()
	if err != nil {
		return err
	}
	if string(b) == string(*written) {
		return nil
	}
	cm := corev1ac.ConfigMap(PlanName, p.namespace).
		WithLabels(labels("fabric")).
		WithData(map[string]string{PlanKey: string(b)})
	if _, err := p.client.CoreV1().ConfigMaps(p.namespace).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("write ConfigMap %s/%s: %w", p.namespace, PlanName, err)
	}
	*written = b
	p.publishedOnce.Do(func() { close(p.published) })
	p.writes.Inc()
	p.log.Info("fabric plan published", "views", len(plan.Views), "nodes", len(plan.Nodes), "gateway", plan.GatewayNode)
	return nil
}

// labels are on everything the agent creates for the fabric.
func labels(component string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "flotilla",
		"app.kubernetes.io/component":  component,
		"app.kubernetes.io/managed-by": "flotilla",
	}
}
