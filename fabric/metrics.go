package fabric

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	routes       prometheus.Gauge
	repairs      prometheus.Counter
	resubscribes *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
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
	return errors.Join(r.Register(m.routes), r.Register(m.repairs), r.Register(m.resubscribes))
}
