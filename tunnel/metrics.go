package tunnel

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	t                *Tunnel
	reconcileSeconds prometheus.Histogram
	reconcileErrors  prometheus.Counter
	repairs          prometheus.Counter
	firstContacts    *prometheus.CounterVec
	resubscribes     *prometheus.CounterVec
	conntrackFlushed prometheus.Counter
	rxBytes          *prometheus.Desc
	txBytes          *prometheus.Desc
	handshake        *prometheus.Desc
	policySeconds    prometheus.Histogram
	droppedPackets   *prometheus.Desc
	droppedBytes     *prometheus.Desc
	setElements      *prometheus.Desc
	hairpinPackets   *prometheus.Desc
	beyondPackets    *prometheus.Desc
}

func newMetrics(t *Tunnel) *metrics {
	m := &metrics{
		t: t,
		reconcileSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flotilla_tunnel_reconcile_duration_seconds",
			Help:    "Time to bring the tunnel's kernel state in line with the desired state.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_tunnel_reconcile_errors_total",
			Help: "Reconciles of the tunnel that failed.",
		}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_tunnel_repaired_objects_total",
			Help: "Owned objects (routes, rules, peers, links) put back after someone changed them.",
		}),
		firstContacts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_tunnel_first_contacts_total",
			Help: "New peers this side left to initiate, by how the wait ended: answered (the peer's handshake came), initiated (nothing came, this side initiated), timed out.",
		}, []string{"outcome"}),
		resubscribes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_tunnel_resubscribes_total",
			Help: "Kernel event subscriptions (route, link, nftables) opened again after they ended on an error such as ENOBUFS; each is followed by reading back everything owned.",
		}, []string{"kind"}),
		conntrackFlushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_tunnel_conntrack_flushed_total",
			Help: "Conntrack entries deleted because the view their translation used was released or remapped.",
		}),
		rxBytes: prometheus.NewDesc("flotilla_tunnel_peer_receive_bytes_total",
			"Bytes received from the peer through WireGuard.", []string{"peer"}, nil),
		txBytes: prometheus.NewDesc("flotilla_tunnel_peer_transmit_bytes_total",
			"Bytes sent to the peer through WireGuard.", []string{"peer"}, nil),
		handshake: prometheus.NewDesc("flotilla_tunnel_peer_last_handshake_timestamp_seconds",
			"Unix time of the last WireGuard handshake with the peer; 0 if never.", []string{"peer"}, nil),
		policySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flotilla_tunnel_policy_update_duration_seconds",
			Help:    "Time to bring the filter of Segregated peers in line with the desired state, kernel acknowledgement included.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		droppedPackets: prometheus.NewDesc("flotilla_tunnel_policy_dropped_packets_total",
			"Packets from a Segregated peer dropped by the filter, by reason (not_allowed: no offloaded pod, Service endpoint and port, or reply matched). Resets when the peer's chain is made again.", []string{"peer", "reason"}, nil),
		droppedBytes: prometheus.NewDesc("flotilla_tunnel_policy_dropped_bytes_total",
			"Bytes of the packets in flotilla_tunnel_policy_dropped_packets_total.", []string{"peer", "reason"}, nil),
		hairpinPackets: prometheus.NewDesc("flotilla_tunnel_hairpin_dropped_packets_total",
			"Packets that came out of the tunnel and were dropped instead of going back into it: above 0, a translation for a peer was missing while it sent (docs/tunnel.md). Resets when the table is made again.", nil, nil),
		beyondPackets: prometheus.NewDesc("flotilla_tunnel_beyond_dropped_packets_total",
			"Packets from a peer for none of this cluster's networks (a host of the node network, the gateway host's other addresses, the internet), dropped: a peer whose WireGuard routes more than our views into the tunnel (docs/tunnel.md). Resets when the table is made again.", nil, nil),
		setElements: prometheus.NewDesc("flotilla_tunnel_policy_set_elements",
			"Elements in a Segregated peer's allowed set (pods: addresses; services: address, protocol, port).", []string{"peer", "set"}, nil),
	}
	for _, kind := range []string{eventsRoute, eventsLink, eventsNFT, eventsNFTPolicy} {
		m.resubscribes.WithLabelValues(kind) // shown at 0 before the first
	}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	return errors.Join(
		r.Register(m.reconcileSeconds),
		r.Register(m.reconcileErrors),
		r.Register(m.repairs),
		r.Register(m.firstContacts),
		r.Register(m.resubscribes),
		r.Register(m.conntrackFlushed),
		r.Register(m.policySeconds),
		r.Register(m),
	)
}

// Describe implements prometheus.Collector for the per-peer figures,
// which are read from WireGuard at scrape time.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.rxBytes
	ch <- m.txBytes
	ch <- m.handshake
	ch <- m.droppedPackets
	ch <- m.droppedBytes
	ch <- m.setElements
	ch <- m.hairpinPackets
	ch <- m.beyondPackets
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.collectPolicy(ch)
	peers, err := m.t.Status()
	if err != nil {
		return
	}
	for _, p := range peers {
		id := p.ClusterID
		if id == "" {
			id = p.PublicKey.String()
		}
		ch <- prometheus.MustNewConstMetric(m.rxBytes, prometheus.CounterValue, float64(p.RxBytes), id)
		ch <- prometheus.MustNewConstMetric(m.txBytes, prometheus.CounterValue, float64(p.TxBytes), id)
		var hs float64
		if !p.LastHandshake.IsZero() {
			hs = float64(p.LastHandshake.UnixNano()) / float64(time.Second)
		}
		ch <- prometheus.MustNewConstMetric(m.handshake, prometheus.GaugeValue, hs, id)
	}
}

// collectPolicy reads the drop counters of the Segregated peers' chains
// and of the guards (forward.go), and the sizes of the peers' sets as
// last applied.
func (m *metrics) collectPolicy(ch chan<- prometheus.Metric) {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	for id, f := range m.t.filter.applied {
		ch <- prometheus.MustNewConstMetric(m.setElements, prometheus.GaugeValue, float64(len(f.Pods)), id, "pods")
		ch <- prometheus.MustNewConstMetric(m.setElements, prometheus.GaugeValue, float64(len(f.Services)), id, "services")
	}
	if m.t.closed {
		return
	}
	if d, err := m.t.nat.dropped(chainForward, hairpinComment); err == nil {
		ch <- prometheus.MustNewConstMetric(m.hairpinPackets, prometheus.CounterValue, float64(d.Packets))
	}
	if d, err := m.t.nat.dropped(chainBeyond, beyondComment); err == nil {
		ch <- prometheus.MustNewConstMetric(m.beyondPackets, prometheus.CounterValue, float64(d.Packets))
	}
	dropped, err := m.t.filter.dropped()
	if err != nil {
		return
	}
	for id, d := range dropped {
		ch <- prometheus.MustNewConstMetric(m.droppedPackets, prometheus.CounterValue, float64(d.Packets), id, "not_allowed")
		ch <- prometheus.MustNewConstMetric(m.droppedBytes, prometheus.CounterValue, float64(d.Bytes), id, "not_allowed")
	}
}
