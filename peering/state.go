package peering

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Phase is where a peering stands.
type Phase string

const (
	// PhaseDiscovered: a member; nothing exchanged yet, or one side waits
	// for its admin.
	PhaseDiscovered Phase = "Discovered"
	// PhaseNegotiating: both accept; views or the tunnel not ready yet.
	PhaseNegotiating Phase = "Negotiating"
	// PhaseConnected: views agreed both ways and a recent handshake.
	PhaseConnected Phase = "Connected"
	// PhaseDegraded: configured without a recent handshake, left out of
	// the data path, or the data path failed to apply.
	PhaseDegraded Phase = "Degraded"
	// PhaseUnreachable: the member failed or left, or neither side can
	// reach the other (both behind NAT; the Reachable condition says so).
	PhaseUnreachable Phase = "Unreachable"
	// PhaseDenied: this side or the other denies networking.
	PhaseDenied Phase = "Denied"
)

// Phases lists every phase.
var Phases = []Phase{PhaseDiscovered, PhaseNegotiating, PhaseConnected, PhaseDegraded, PhaseUnreachable, PhaseDenied}

// Condition is one aspect of a peering: whether it holds, and why, in a
// CamelCase reason and a sentence for a person.
type Condition struct {
	OK      bool
	Reason  string
	Message string
}

// View says how one side addresses a range of the other: Range is the
// real range, As how the viewing side addresses it.
type View struct {
	Range netip.Prefix
	As    netip.Prefix
}

// PeerState is what this cluster knows about one peer. The engine hands it
// to the Publisher whenever it changes.
type PeerState struct {
	ClusterID string
	// Name is the peer's human name, from its statement.
	Name string
	// Labels are the peer's cluster labels, from its last accepted
	// statement.
	Labels map[string]string
	Phase  Phase

	// Member: the cluster is an alive member of the federation.
	Member Condition
	// Accepted: both sides accept networking.
	Accepted Condition
	// ViewsAgreed: both sides know how each sees the other.
	ViewsAgreed Condition
	// TunnelUp: the tunnel to the peer has a recent handshake.
	TunnelUp Condition
	// Reachable: one of the two gateways can be reached first, so the
	// other can open the tunnel and the gossip to it.
	Reachable Condition

	// IdentityKey is the member's identity key, which grants to it are
	// sealed to; nil before discovery reports the member.
	IdentityKey ed25519.PublicKey
	// Sources are the discovery sources that found the member.
	Sources []string
	// Gossip is the member's gossip address.
	Gossip string
	// Endpoint is the peer's WireGuard endpoint in use (or announced).
	Endpoint netip.AddrPort
	// PublicKey is the peer's WireGuard key; zero before its statement.
	PublicKey tunnel.Key
	// TheirNetworks are the peer's ranges and this cluster's views of them.
	TheirNetworks []View
	// MyNetworks are this cluster's ranges and the peer's views of them.
	MyNetworks []View
	// LastHandshake is the last WireGuard handshake, to the second; zero:
	// none since the tunnel was configured.
	LastHandshake time.Time
	// StatementGeneration is the generation of the peer's last accepted
	// statement.
	StatementGeneration uint64
	// SpecGeneration is the generation of the spec this state acted on;
	// zero before any spec was reported.
	SpecGeneration int64
}

// phase derives where the peering with p stands.
func (e *Engine) phase(p *peer) Phase {
	now := e.cfg.Now()
	mine, theirs := e.decision(p), decisionOf(p.hello)
	switch {
	case p.member != nil && !p.member.Alive, p.member == nil && !p.goneSince.IsZero() && p.configured.IsZero(),
		e.bothBehindNAT(p):
		return PhaseUnreachable
	case mine == Deny || theirs == Deny:
		return PhaseDenied
	case p.hello == nil || mine != Accept || theirs != Accept:
		return PhaseDiscovered
	case p.tunnelErr != nil:
		return PhaseDegraded
	case p.configured.IsZero():
		return PhaseNegotiating
	}
	// A failed apply means the kernel may not hold what the Peer says,
	// whatever the last handshake.
	if e.applyErr != nil {
		return PhaseDegraded
	}
	if e.handshakeRecent(p, now) {
		return PhaseConnected
	}
	if now.Sub(p.configured) > 30*time.Second {
		return PhaseDegraded
	}
	return PhaseNegotiating
}

func (e *Engine) handshakeRecent(p *peer, now time.Time) bool {
	st, ok := e.stats[p.id]
	return ok && !st.LastHandshake.IsZero() && now.Sub(st.LastHandshake) < e.cfg.HandshakeTimeout
}

// state computes the state of p. It holds no clock readings but those of
// events (a handshake, the member's failure), so it changes only when
// something happens.
func (e *Engine) state(p *peer) PeerState {
	now := e.cfg.Now()
	s := PeerState{ClusterID: p.id, Phase: e.phase(p), SpecGeneration: e.specs[p.id].Generation}
	if p.member != nil {
		s.Gossip = p.member.Gossip
		s.Sources = slices.Clone(p.member.Sources)
		s.IdentityKey = slices.Clone(p.member.PublicKey)
	}
	if p.hello != nil {
		s.Name = p.hello.Name
		s.Labels = maps.Clone(p.hello.Labels)
		s.StatementGeneration = p.hello.Generation
		s.Endpoint = p.hello.Endpoint
		copy(s.PublicKey[:], p.hello.WireGuardKey)
	}
	for _, v := range p.myViews {
		s.TheirNetworks = append(s.TheirNetworks, View{Range: v.Remote, As: v.View})
	}
	for _, v := range e.cfg.Ledger.TheirViews(p.id) {
		if slices.Contains(e.cfg.Networks, v.Mine) {
			s.MyNetworks = append(s.MyNetworks, View{Range: v.Mine, As: v.Theirs})
		}
	}
	if st, ok := e.stats[p.id]; ok && !p.configured.IsZero() {
		if !st.LastHandshake.IsZero() {
			s.LastHandshake = st.LastHandshake.Truncate(time.Second)
		}
		if st.Endpoint.IsValid() {
			s.Endpoint = st.Endpoint
		}
	}

	switch {
	case p.member == nil:
		s.Member = Condition{false, "NotSeen", "not seen in the federation since this agent started"}
	case p.member.Alive:
		s.Member = Condition{true, "Alive", "alive member of the federation"}
	default:
		until := p.goneSince.Add(e.cfg.UnreachableGrace)
		msg := fmt.Sprintf("the member stopped answering at %s; its tunnel and view were removed after the grace period", p.goneSince.UTC().Format(time.RFC3339))
		if now.Before(until) {
			msg = fmt.Sprintf("the member stopped answering at %s; tunnel and view kept until %s", p.goneSince.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
		}
		s.Member = Condition{false, "Unreachable", msg}
	}
	s.Reachable = e.reachable(p)
	mine, theirs := e.decision(p), decisionOf(p.hello)
	switch {
	case mine == Deny && now.Before(p.resetUntil):
		s.Accepted = Condition{false, "Reset", "the Peer object was deleted; peering reset"}
	case mine == Deny:
		s.Accepted = Condition{false, "DeniedHere", "spec.networking is Deny"}
	case theirs == Deny:
		s.Accepted = Condition{false, "DeniedByPeer", "the peer denies networking with this cluster"}
	case mine == Pending:
		s.Accepted = Condition{false, "WaitingForAdmin", "--peering=manual: set spec.networking to Accept to connect"}
	case theirs == "":
		s.Accepted = Condition{false, "WaitingForPeer", "no statement from the peer yet"}
	case theirs == Pending:
		s.Accepted = Condition{false, "WaitingForPeer", "the peer's admin has not accepted yet"}
	default:
		s.Accepted = Condition{true, "Accepted", "both sides accept networking"}
	}
	switch {
	case errors.Is(p.viewsErr, ipam.ErrExhausted):
		s.ViewsAgreed = Condition{false, "PoolExhausted", p.viewsErr.Error()}
	case errors.Is(p.viewsErr, errSuccession):
		s.ViewsAgreed = Condition{false, "WaitingForOldIdentity", p.viewsErr.Error()}
	case p.viewsErr != nil:
		s.ViewsAgreed = Condition{false, "Refused", p.viewsErr.Error()}
	case p.theirOK && len(p.myViews) > 0:
		s.ViewsAgreed = Condition{true, "Agreed", "each side knows how the other sees it"}
	default:
		s.ViewsAgreed = Condition{false, "Pending", "views not exchanged yet"}
	}
	switch {
	case p.tunnelErr != nil:
		s.TunnelUp = Condition{false, "Refused", p.tunnelErr.Error()}
	case e.applyErr != nil:
		s.TunnelUp = Condition{false, "ApplyFailed", e.applyErr.Error()}
	case p.configured.IsZero():
		s.TunnelUp = Condition{false, "NotConfigured", "no tunnel to the peer"}
	case e.handshakeRecent(p, now):
		s.TunnelUp = Condition{true, "Handshake", "recent WireGuard handshake"}
	default:
		s.TunnelUp = Condition{false, "NoHandshake", "configured; no recent WireGuard handshake"}
	}
	return s
}

// publish counts the peers by phase and hands changed states to the
// Publisher.
func (e *Engine) publish() {
	counts := map[Phase]int{}
	phases, names := map[string]Phase{}, map[string]string{}
	for _, p := range e.peers {
		ph := e.phase(p)
		counts[ph]++
		phases[p.id] = ph
		if p.hello != nil {
			names[p.id] = p.hello.Name
		}
	}
	for _, ph := range Phases {
		e.metrics.peers.WithLabelValues(string(ph)).Set(float64(counts[ph]))
	}
	e.metrics.setPhases(phases, names)
	if e.cfg.Publisher == nil {
		return
	}
	now := e.cfg.Now()
	for _, p := range e.peers {
		if p.member == nil && p.hello == nil {
			continue // nothing to say yet
		}
		if now.Before(p.resetUntil) {
			continue // let the deletion stand until the reset is over
		}
		s := e.state(p)
		if last, ok := e.published[p.id]; ok && reflect.DeepEqual(last, s) {
			continue
		}
		e.published[p.id] = s
		e.cfg.Publisher.Publish(s)
	}
}

// bothBehindNAT reports whether neither this cluster nor p can be reached
// first: nothing either sends reaches the other.
func (e *Engine) bothBehindNAT(p *peer) bool {
	return e.cfg.OutboundOnly && p.member != nil && p.member.OutboundOnly
}

// reachable says whether a tunnel between this cluster and p can be
// opened, and which side opens it.
func (e *Engine) reachable(p *peer) Condition {
	switch {
	case p.member == nil:
		return Condition{false, "NotSeen", "not seen in the federation since this agent started"}
	case e.bothBehindNAT(p):
		return Condition{false, "BothBehindNAT", "this cluster and the peer are both behind NAT (outbound only): neither can reach the other first, so they cannot peer; " +
			"make one of them reachable (an address others can reach, with UDP 51820 and TCP/UDP 7946 open, and no --behind-nat)"}
	case p.member.OutboundOnly:
		return Condition{true, "PeerBehindNAT", "the peer is behind NAT: it opens the tunnel and the gossip to this cluster, which learns its endpoint from its handshakes"}
	case e.cfg.OutboundOnly:
		return Condition{true, "BehindNAT", "this cluster is behind NAT: it opens the tunnel and the gossip to the peer, and keeps them open"}
	}
	return Condition{true, "Reachable", "both gateways can be reached"}
}
