package discovery

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the discovery counters. Gauges of members and candidates are
// computed when scraped, from the same tables Snapshot reads.
type metrics struct {
	found         *prometheus.CounterVec // by source
	joins         *prometheus.CounterVec // by source
	joinFailures  *prometheus.CounterVec // by source
	recordsDrop   *prometheus.CounterVec // by reason
	candidateDrop *prometheus.CounterVec // by source, reason
	coalesced     prometheus.Counter
	// Messages sent with Send and received for OnMessage.
	messagesSent     prometheus.Counter
	sendFailures     prometheus.Counter
	messagesReceived prometheus.Counter
	messagesDrop     *prometheus.CounterVec // by reason
	// Times this member re-announced itself alive because a prober
	// told it it was suspected (notice.go).
	refutations prometheus.Counter
	// State exchanges this member started with members that had joined
	// it (joinpush.go).
	pushes prometheus.Counter
	// Gossip streams refused at accept or cut at their read cap, by
	// reason (streamgate.go).
	streamsLimited *prometheus.CounterVec
	// Gossip packets dropped because their source sent more than its
	// rate (packetgate.go).
	packetsLimited prometheus.Counter
	members        *prometheus.Desc
	candidates     *prometheus.Desc
	d              *Discovery
}

func newMetrics(d *Discovery, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		d: d,
		found: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_candidates_found_total",
			Help: "Join candidates learned, by source (mdns, dns, seed).",
		}, []string{"source"}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_joins_total",
			Help: "Join attempts towards candidates, by source.",
		}, []string{"source"}),
		joinFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_join_failures_total",
			Help: "Join attempts that failed, by source.",
		}, []string{"source"}),
		recordsDrop: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_records_dropped_total",
			Help: "Member records refused, by reason.",
		}, []string{"reason"}),
		candidateDrop: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_candidates_dropped_total",
			Help: "mDNS and DNS-SD answers ignored, by source and reason.",
		}, []string{"source", "reason"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_events_coalesced_total",
			Help: "Member events replaced by a newer event before a subscriber read them.",
		}),
		messagesSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_messages_sent_total",
			Help: "Messages delivered to members with Send.",
		}),
		sendFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_send_failures_total",
			Help: "Sends that failed or timed out after the destination was found alive.",
		}),
		messagesReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_messages_received_total",
			Help: "Messages from members handed to OnMessage.",
		}),
		messagesDrop: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_messages_dropped_total",
			Help: "Messages from members dropped, by reason (empty, unknown_kind, oversized, no_handler; exchange_state: what a member sent in a state exchange).",
		}, []string{"reason"}),
		refutations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_suspicion_refutations_total",
			Help: "Times this member, told by a member whose probe of it failed, announced itself alive again.",
		}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_join_pushes_total",
			Help: "State exchanges this member started with members that had joined it, once joins to it went quiet, so that each learns of those who joined after it.",
		}),
		streamsLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_discovery_gossip_streams_limited_total",
			Help: "Gossip streams (TCP) refused before memberlist read them, or cut at their read cap, by reason (busy, source_busy, source_rate, oversized).",
		}, []string{"reason"}),
		packetsLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_discovery_gossip_packets_limited_total",
			Help: "Gossip packets (UDP) dropped before memberlist read them because their source address sent more than its rate.",
		}),
		members: prometheus.NewDesc("flotilla_discovery_members",
			"Other clusters known, by state (alive, failed, left).", []string{"state"}, nil),
		candidates: prometheus.NewDesc("flotilla_discovery_candidates",
			"Join candidates currently known, by source.", []string{"source"}, nil),
	}
	for _, r := range []string{StreamBusy, StreamSourceBusy, StreamSourceRate, StreamOversized} {
		m.streamsLimited.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.found, m.joins, m.joinFailures, m.recordsDrop, m.candidateDrop, m.coalesced,
		m.messagesSent, m.sendFailures, m.messagesReceived, m.messagesDrop, m.refutations, m.pushes, m.streamsLimited, m.packetsLimited, m} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("register discovery metrics: %w (one Discovery per registry)", err)
			}
			return nil, fmt.Errorf("register discovery metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.members
	ch <- m.candidates
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	byState := map[MemberState]int{StateAlive: 0, StateFailed: 0, StateLeft: 0}
	for _, mem := range m.d.members() {
		byState[mem.State]++
	}
	for s, n := range byState {
		ch <- prometheus.MustNewConstMetric(m.members, prometheus.GaugeValue, float64(n), string(s))
	}
	bySource := map[Source]int{SourceMDNS: 0, SourceDNS: 0, SourceSeed: 0}
	for _, c := range m.d.cands.list() {
		for _, s := range c.Sources {
			bySource[s]++
		}
	}
	for s, n := range bySource {
		ch <- prometheus.MustNewConstMetric(m.candidates, prometheus.GaugeValue, float64(n), string(s))
	}
}
