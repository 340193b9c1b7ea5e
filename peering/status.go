package peering

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/tunnel"
)

// phase derives where the peering with p stands.
func (e *Engine) phase(p *peer) v1alpha1.Phase {
	now := e.cfg.Now()
	mine, theirs := e.decision(p), decisionOf(p.hello)
	switch {
	case p.member != nil && !p.member.Alive, p.member == nil && !p.goneSince.IsZero() && p.configured.IsZero():
		return v1alpha1.PhaseUnreachable
	case mine == Deny || theirs == Deny:
		return v1alpha1.PhaseDenied
	case p.hello == nil || mine != Accept || theirs != Accept:
		return v1alpha1.PhaseDiscovered
	case p.tunnelErr != nil:
		return v1alpha1.PhaseDegraded
	case p.configured.IsZero():
		return v1alpha1.PhaseNegotiating
	}
	// A failed apply means the kernel may not hold what the Peer says,
	// whatever the last handshake.
	if e.applyErr != nil {
		return v1alpha1.PhaseDegraded
	}
	if e.handshakeRecent(p, now) {
		return v1alpha1.PhaseConnected
	}
	if now.Sub(p.configured) > 30*time.Second {
		return v1alpha1.PhaseDegraded
	}
	return v1alpha1.PhaseNegotiating
}

func (e *Engine) handshakeRecent(p *peer, now time.Time) bool {
	st, ok := e.stats[p.id]
	return ok && !st.LastHandshake.IsZero() && now.Sub(st.LastHandshake) < e.cfg.HandshakeTimeout
}

// status computes the Peer status of p.
func (e *Engine) status(p *peer) v1alpha1.PeerStatus {
	now := e.cfg.Now()
	s := v1alpha1.PeerStatus{Phase: e.phase(p)}
	if p.member != nil {
		s.Gossip = p.member.Gossip
		s.Sources = []string{"gossip"}
	}
	if p.hello != nil {
		s.ClusterName = p.hello.Name
		s.StatementGeneration = int64(p.hello.Generation & (1<<63 - 1))
		s.Endpoint = p.hello.Endpoint.String()
		var k tunnel.Key
		copy(k[:], p.hello.WireGuardKey)
		s.PublicKey = k.String()
	}
	for _, v := range p.myViews {
		s.TheirNetworks = append(s.TheirNetworks, v1alpha1.NetworkView{Range: v.Remote.String(), As: v.View.String()})
	}
	for _, v := range e.cfg.Ledger.TheirViews(p.id) {
		s.MyNetworks = append(s.MyNetworks, v1alpha1.NetworkView{Range: v.Mine.String(), As: v.Theirs.String()})
	}
	var parts []string
	for _, v := range s.TheirNetworks {
		parts = append(parts, v.Range+"=>"+v.As)
	}
	s.Views = strings.Join(parts, ",")
	if st, ok := e.stats[p.id]; ok && !p.configured.IsZero() {
		if !st.LastHandshake.IsZero() {
			t := metav1.NewTime(st.LastHandshake.Truncate(time.Second))
			s.LastHandshake = &t
		}
		s.ReceiveBytes, s.TransmitBytes = st.RxBytes, st.TxBytes
		if st.Endpoint.IsValid() {
			s.Endpoint = st.Endpoint.String()
		}
	}

	set := func(t string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: t, Status: st, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now)})
	}
	switch {
	case p.member == nil:
		set(v1alpha1.ConditionMember, false, "NotSeen", "not seen in the federation since this agent started")
	case p.member.Alive:
		set(v1alpha1.ConditionMember, true, "Alive", "alive member of the federation")
	default:
		left := e.cfg.UnreachableGrace - now.Sub(p.goneSince)
		msg := "the member stopped answering; its tunnel and view were removed after the grace period"
		if left > 0 {
			msg = fmt.Sprintf("the member stopped answering; tunnel and view kept for another %s", left.Round(time.Second))
		}
		set(v1alpha1.ConditionMember, false, "Unreachable", msg)
	}
	mine, theirs := e.decision(p), decisionOf(p.hello)
	switch {
	case mine == Deny && now.Before(p.resetUntil):
		set(v1alpha1.ConditionAccepted, false, "Reset", "the Peer object was deleted; peering reset")
	case mine == Deny:
		set(v1alpha1.ConditionAccepted, false, "DeniedHere", "spec.networking is Deny")
	case theirs == Deny:
		set(v1alpha1.ConditionAccepted, false, "DeniedByPeer", "the peer denies networking with this cluster")
	case mine == Pending:
		set(v1alpha1.ConditionAccepted, false, "WaitingForAdmin", "--peering=manual: set spec.networking to Accept to connect")
	case theirs == "":
		set(v1alpha1.ConditionAccepted, false, "WaitingForPeer", "no statement from the peer yet")
	case theirs == Pending:
		set(v1alpha1.ConditionAccepted, false, "WaitingForPeer", "the peer's admin has not accepted yet")
	default:
		set(v1alpha1.ConditionAccepted, true, "Accepted", "both sides accept networking")
	}
	switch {
	case p.viewsErr != nil:
		set(v1alpha1.ConditionViewsAgreed, false, "Refused", p.viewsErr.Error())
	case p.theirOK && len(p.myViews) > 0:
		set(v1alpha1.ConditionViewsAgreed, true, "Agreed", "each side knows how the other sees it")
	default:
		set(v1alpha1.ConditionViewsAgreed, false, "Pending", "views not exchanged yet")
	}
	switch {
	case p.tunnelErr != nil:
		set(v1alpha1.ConditionTunnelUp, false, "Refused", p.tunnelErr.Error())
	case e.applyErr != nil:
		set(v1alpha1.ConditionTunnelUp, false, "ApplyFailed", e.applyErr.Error())
	case p.configured.IsZero():
		set(v1alpha1.ConditionTunnelUp, false, "NotConfigured", "no tunnel to the peer")
	case e.handshakeRecent(p, now):
		set(v1alpha1.ConditionTunnelUp, true, "Handshake", "recent WireGuard handshake")
	default:
		set(v1alpha1.ConditionTunnelUp, false, "NoHandshake", "configured; no recent WireGuard handshake")
	}
	return s
}

// writeStatuses hands changed statuses to the writer goroutine.
func (e *Engine) writeStatuses() {
	counts := map[v1alpha1.Phase]int{}
	for _, p := range e.peers {
		counts[e.phase(p)]++
	}
	for _, ph := range allPhases {
		e.metrics.peers.WithLabelValues(string(ph)).Set(float64(counts[ph]))
	}
	if e.cfg.Status == nil {
		return
	}
	for _, p := range e.peers {
		if p.member == nil && p.hello == nil {
			continue // known only from a Peer object: nothing to say yet
		}
		if e.cfg.Now().Before(p.resetUntil) {
			continue // let the deletion stand until the reset is over
		}
		name := ""
		if p.hello != nil {
			name = p.hello.Name
		}
		e.statusWriter().post(p.id, name, e.status(p))
	}
}

var allPhases = []v1alpha1.Phase{
	v1alpha1.PhaseDiscovered, v1alpha1.PhaseNegotiating, v1alpha1.PhaseConnected,
	v1alpha1.PhaseDegraded, v1alpha1.PhaseUnreachable, v1alpha1.PhaseDenied,
}

// Snapshot is one line per peer, for `flotilla status` and tests.
type Snapshot struct {
	ClusterID string
	Name      string
	Phase     v1alpha1.Phase
	Status    v1alpha1.PeerStatus
}

// Snapshot returns the state of every peer, sorted by cluster ID.
func (e *Engine) Snapshot() []Snapshot {
	out := make(chan []Snapshot, 1)
	e.input(func() {
		var s []Snapshot
		for _, p := range e.peers {
			st := e.status(p)
			s = append(s, Snapshot{ClusterID: p.id, Name: st.ClusterName, Phase: st.Phase, Status: st})
		}
		sort.Slice(s, func(i, j int) bool { return s[i].ClusterID < s[j].ClusterID })
		out <- s
	})
	select {
	case s := <-out:
		return s
	case <-e.done():
		return nil
	}
}

type metrics struct {
	peers        *prometheus.GaugeVec
	accepted     prometheus.Counter
	sent         prometheus.Counter
	refused      *prometheus.CounterVec
	sendErrors   prometheus.Counter
	applyErrors  prometheus.Counter
	applySeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_peers", Help: "Peers by phase.",
		}, []string{"phase"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_messages_accepted_total", Help: "Peering statements accepted (new generations).",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_statements_issued_total", Help: "New peering statements issued by this cluster.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_peering_messages_refused_total", Help: "Peering messages refused, by reason.",
		}, []string{"reason"}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_peering_send_errors_total", Help: "Failed sends of peering messages (resent later).",
		}),
		applyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_dataplane_apply_errors_total", Help: "Failed applies of the desired data path.",
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
		reg.MustRegister(m.peers, m.accepted, m.sent, m.refused, m.sendErrors, m.applyErrors, m.applySeconds)
	}
	return m
}
