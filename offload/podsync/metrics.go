package podsync

import (
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
)

type podMetrics struct {
	lag    *prometheus.HistogramVec
	errors *prometheus.CounterVec
}

func newPodMetrics(reg prometheus.Registerer, r *Reflector) (*podMetrics, error) {
	m := &podMetrics{
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flotilla_reflection_lag_seconds",
			Help: "From a change seen on one side (its watch event) to the write that acts on it on the other: kind pod, the provider's pod created or deleted; kind podstatus, the local pod's status written or its deletion confirmed.",
			// 5 ms to 41 s.
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"kind", "peer"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_reflection_errors_total",
			Help: "Pod reflections that failed, by provider and reason (quota, forbidden, invalid, unauthorized, unreachable, name_taken, untranslatable, not_offloaded, local).",
		}, []string{"peer", "reason"}),
	}
	return m, ctrl.Register(reg, m.lag, m.errors, offloadedPods{r})
}

// offloadedPodsDesc is flotilla_offloaded_pods, counted at each scrape
// from the local pods' informers: one truth, no bookkeeping.
var offloadedPodsDesc = prometheus.NewDesc("flotilla_offloaded_pods",
	"Pods of this cluster bound to a provider's virtual node, by provider and the phase shown here.", []string{"peer", "phase"}, nil)

type offloadedPods struct{ r *Reflector }

func (c offloadedPods) Describe(ch chan<- *prometheus.Desc) { ch <- offloadedPodsDesc }

func (c offloadedPods) Collect(ch chan<- prometheus.Metric) {
	for _, pp := range c.r.providers.Snapshot() {
		if !pp.localSynced.Load() {
			continue
		}
		counts := map[corev1.PodPhase]int{corev1.PodPending: 0, corev1.PodRunning: 0, corev1.PodSucceeded: 0, corev1.PodFailed: 0}
		for _, obj := range pp.localPods.GetStore().List() {
			p, ok := obj.(*keptPod)
			if !ok {
				continue
			}
			phase := p.status.Phase
			if phase == "" {
				phase = corev1.PodPending
			}
			counts[phase]++
		}
		for phase, n := range counts {
			ch <- prometheus.MustNewConstMetric(offloadedPodsDesc, prometheus.GaugeValue, float64(n), pp.id, string(phase))
		}
	}
}
