package fabric

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	routes       prometheus.Gauge
	repairs      prometheus.Counter
	resubscribes *prometheus.CounterVec
	guardDrops   *prometheus.Desc
	guard        func() (map[string]uint64, bool) // read at scrape time
}

// newMetrics makes the fabric's metrics; guard reads the gateway guard's
// drop counters by hook.
func newMetrics(guard func() (map[string]uint64, bool)) *metrics {
	m := &metrics{
		guard: guard,
		guardDrops: prometheus.NewDesc("flotilla_fabric_guard_dropped_packets_total",
			"Packets for a view that the gateway node dropped instead of sending them anywhere but the tunnel, by hook (forward: pods' and other nodes', output: the node's own): "+
				"the tunnel had no route for the view (a takeover under way, a fenced replica, a data path down). Resets when the fabric's table is made again; absent on workers.",
			[]string{"hook"}, nil),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flotilla_fabric_routes",
			Help: "Routes of the fabric in its own table on this node: views via the gateway (workers), nodes' pod blocks (gateway).",
		}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_fabric_repairs_total",
			Help: "Owned objects (routes, rules, nftables objects and set elements) put back or corrected after someone changed them.",
		}),
		resubscribes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_fabric_resubscribes_total",
			Help: "Kernel event subscriptions (rtnetlink, nftables) opened again after they ended on an error such as ENOBUFS; each is followed by reading back everything owned.",
		}, []string{"kind"}),
	}
	for _, kind := range []string{eventsRoute, eventsNFT} {
		m.resubscribes.WithLabelValues(kind) // shown at 0 before the first
	}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	return errors.Join(r.Register(m.routes), r.Register(m.repairs), r.Register(m.resubscribes), r.Register(m))
}

// Describe implements prometheus.Collector for the guard's drops, read
// from the kernel at scrape time.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.guardDrops }

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	dropped, ok := m.guard()
	if !ok {
		return
	}
	for _, g := range guardHooks {
		ch <- prometheus.MustNewConstMetric(m.guardDrops, prometheus.CounterValue, float64(dropped[g.hookName]), g.hookName)
	}
}
