package peering

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	peers        *prometheus.GaugeVec
	phase        *peerPhases
	accepted     prometheus.Counter
	repeated     prometheus.Counter
	sent         prometheus.Counter
	refused      *prometheus.CounterVec
	held         prometheus.Gauge
	sendErrors   prometheus.Counter
	successions  prometheus.Counter
	applyErrors  prometheus.Counter
	applySeconds prometheus.Histogram
	reconciles   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, dp Dataplane) *metrics {
	m := &metrics{
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_peers", Help: "Peers by phase.",
		}, []string{"phase"}),
		phase: newPeerPhases(),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_messages_accepted_total", Help: "Peering statements accepted (new generations).",
		}),
		repeated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_messages_repeated_total", Help: "Peering statements received again (resends of a generation already accepted), which change nothing.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_statements_issued_total", Help: "New peering statements issued by this cluster.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_peering_messages_refused_total", Help: "Peering messages refused, by reason.",
		}, []string{"reason"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flotilla_peering_messages_held", Help: "Peering messages waiting for discovery to report their sender.",
		}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_send_errors_total", Help: "Failed sends of peering messages (resent later).",
		}),
		successions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_successions_total", Help: "Old identities whose views went to a new identity of the same cluster (same name and endpoint).",
		}),
		applyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_dataplane_apply_errors_total", Help: "Failed applies of the desired data path.",
		}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_reconciles_total", Help: "Passes of the peering engine over every peer (after a change, and once a second).",
		}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flotilla_dataplane_apply_seconds", Help: "Time to apply the desired data path.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	for _, r := range []string{"malformed", "incompatible", "forged", "replayed", "misdirected", "inbox_full", "unknown_sender"} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.peers, m.phase, m.accepted, m.repeated, m.sent, m.refused, m.held, m.sendErrors, m.successions, m.applyErrors, m.applySeconds, m.reconciles, newTraffic(dp))
	}
	return m
}

// PeerNames are the peers the engine knows, by cluster ID, each with the
// name it announced ("" until its first statement): what its last pass
// published, as flotilla_peer_phase serves it.
func (e *Engine) PeerNames() map[string]string { return e.metrics.phase.names() }

// setPhases sets each peer's phase, by cluster ID, with its cluster
// name; peers not named are no longer known.
func (m *metrics) setPhases(phases map[string]Phase, names map[string]string) {
	m.phase.set(phases, names)
}

// peerPhases is flotilla_peer_phase: 1 for the phase each peer is in and
// 0 for the others, so that an alert names the peer that is down. The
// series are made when scraped from each peer's phase and name: a gauge
// kept per peer and phase was 3.4 KiB a peer.
type peerPhases struct {
	desc  *prometheus.Desc
	mu    sync.Mutex
	peers map[string]phaseOf
}

type phaseOf struct {
	cluster string
	phase   Phase
}

func newPeerPhases() *peerPhases {
	return &peerPhases{
		desc: prometheus.NewDesc("flotilla_peer_phase", "1 for the phase each peer is in, 0 for the others (peer: its cluster ID, peer_name: the name it announced).",
			[]string{"peer", "peer_name", "phase"}, nil),
		peers: map[string]phaseOf{},
	}
}

// set replaces the phases a scrape reads (never changed in place: a
// scrape may be reading them), when they changed.
func (p *peerPhases) set(phases map[string]Phase, names map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.same(phases, names) {
		return
	}
	peers := make(map[string]phaseOf, len(phases))
	for id, ph := range phases {
		peers[id] = phaseOf{cluster: names[id], phase: ph}
	}
	p.peers = peers
}

func (p *peerPhases) same(phases map[string]Phase, names map[string]string) bool {
	if len(p.peers) != len(phases) {
		return false
	}
	for id, ph := range phases {
		if p.peers[id] != (phaseOf{cluster: names[id], phase: ph}) {
			return false
		}
	}
	return true
}

// names are the current peers' names by cluster ID ("" for a peer that
// has not said its name yet).
func (p *peerPhases) names() map[string]string {
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	out := make(map[string]string, len(peers))
	for id, of := range peers {
		out[id] = of.cluster
	}
	return out
}

func (p *peerPhases) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

func (p *peerPhases) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	for id, of := range peers {
		for _, ph := range Phases {
			v := 0.0
			if ph == of.phase {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, v, id, of.cluster, string(ph))
		}
	}
}

// traffic exports the tunnel's byte counters per peer. It reads them from
// the tunnel when scraped: they change with every packet, so they belong
// in metrics, not in Peer objects.
type traffic struct {
	dp     Dataplane
	rx, tx *prometheus.Desc
}

func newTraffic(dp Dataplane) *traffic {
	return &traffic{
		dp: dp,
		rx: prometheus.NewDesc("flotilla_peer_receive_bytes_total",
			"Bytes received through the tunnel from the peer (restarts at zero when its tunnel peer is recreated).", []string{"peer"}, nil),
		tx: prometheus.NewDesc("flotilla_peer_transmit_bytes_total",
			"Bytes sent through the tunnel to the peer (restarts at zero when its tunnel peer is recreated).", []string{"peer"}, nil),
	}
}

func (t *traffic) Describe(ch chan<- *prometheus.Desc) {
	ch <- t.rx
	ch <- t.tx
}

func (t *traffic) Collect(ch chan<- prometheus.Metric) {
	st, err := t.dp.Status()
	if err != nil {
		// An invalid metric would fail the whole scrape; missing series
		// say enough, and the tunnel's readiness check says why.
		return
	}
	for _, s := range st {
		ch <- prometheus.MustNewConstMetric(t.rx, prometheus.CounterValue, float64(s.RxBytes), s.ClusterID)
		ch <- prometheus.MustNewConstMetric(t.tx, prometheus.CounterValue, float64(s.TxBytes), s.ClusterID)
	}
}
