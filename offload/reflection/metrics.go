package reflection

import (
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/prometheus/client_golang/prometheus"
)

type reflectMetrics struct {
	lag     *prometheus.HistogramVec
	errors  *prometheus.CounterVec
	dropped *prometheus.CounterVec
}

func newReflectMetrics(reg prometheus.Registerer, r *Reflector) (*reflectMetrics, error) {
	m := &reflectMetrics{
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flotilla_object_reflection_lag_seconds",
			Help: "From a change seen here (a ConfigMap, Secret, Service, EndpointSlice or a pod referencing one) to the write on the provider that acts on it, by kind and provider.",
			// 1 ms to 16 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"kind", "peer"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_object_reflection_errors_total",
			Help: "Reflections of objects that failed, by kind, provider and reason (quota, forbidden, invalid, unauthorized, unreachable, name_taken, local).",
		}, []string{"kind", "peer", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_reflection_dropped_endpoints_total",
			Help: "Endpoints left out of reflected EndpointSlices, counted at each write of a slice, by provider and reason (third_cluster: on a cluster other than this one and the provider; untranslatable: no view covers the address).",
		}, []string{"peer", "reason"}),
	}
	return m, ctrl.Register(reg, m.lag, m.errors, m.dropped, reflectedObjects{r})
}

var reflectedObjectsDesc = prometheus.NewDesc("flotilla_reflected_objects",
	"Objects this cluster reflects to a provider, by provider and kind, counted at each scrape from the watches of what is there.", []string{"peer", "kind"}, nil)

// reflectedObjects counts from the providers' caches: one truth, no
// bookkeeping.
type reflectedObjects struct{ r *Reflector }

func (c reflectedObjects) Describe(ch chan<- *prometheus.Desc) { ch <- reflectedObjectsDesc }

func (c reflectedObjects) Collect(ch chan<- prometheus.Metric) {
	for _, pp := range c.r.providers.Snapshot() {
		for kind, n := range pp.counts() {
			ch <- prometheus.MustNewConstMetric(reflectedObjectsDesc, prometheus.GaugeValue, float64(n), pp.id, kind)
		}
	}
}
