// Package policyapi is the Kubernetes side of segregated traffic (issue
// 16, docs/policy.md). The Feed follows, with informers, what each peer
// may reach (its pods offloaded here, the Services reflected or exported
// to it), turns it into policy's plain input (input.go) and writes each
// Peer's mode in effect into its status; the SegregatingDataplane puts
// policy's decision into every desired state the peering engine applies,
// and applies the last one again when only the decision changed. Package
// policy decides, and knows nothing of Kubernetes.
package policyapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/tunnel"
)

// trafficMode is a Peer's effective mode: its spec.traffic, or the agent's
// --traffic when that is empty.
func trafficMode(p *v1alpha1.Peer, def policy.Mode) policy.Mode {
	switch p.Spec.Traffic {
	case v1alpha1.TrafficFull:
		return policy.Full
	case v1alpha1.TrafficSegregated:
		return policy.Segregated
	}
	return def
}

// trafficInput is what the agent knows for policy.Decide, in plain terms,
// every address and port already checked (input.go).
type trafficInput struct {
	// Default is --traffic, the mode of a peer without a Peer object or
	// with an empty spec.traffic.
	Default policy.Mode
	// Modes are the Peers' effective modes.
	Modes map[string]policy.Mode
	// Pods are each consumer's pods offloaded here.
	Pods map[string][]netip.Addr
	// Reflected are the Services reflected to each provider.
	Reflected map[string][]policy.Service
	// Exported are the Services this cluster exports: to every peer.
	Exported []policy.Service
}

func (in trafficInput) mode(id string) policy.Mode {
	if m, ok := in.Modes[id]; ok {
		return m
	}
	return in.Default
}

// peer is what policy decides on for peer id.
func (in trafficInput) peer(id string) policy.Peer {
	p := policy.Peer{ID: id, Mode: in.mode(id), Pods: in.Pods[id]}
	if p.Mode == policy.Segregated {
		p.Services = append(slices.Clone(in.Reflected[id]), in.Exported...)
	}
	return p
}

// SegregatingDataplane puts the decision of policy into every desired
// state the engine applies. Until the feed has given it a first input
// (its informers synced), it holds what the kernel held at start: the
// sets an earlier run made survive a restart, and neither are they
// emptied (allowed traffic would drop) nor removed (the peer would reach
// everything) before the agent knows what to put there.
type SegregatingDataplane struct {
	peering.Dataplane
	log *slog.Logger

	mu   sync.Mutex
	last *tunnel.Desired // the engine's, as it gave it
	// held is what the kernel held at start, by peer; used only while
	// input is nil.
	held  map[string]policy.Sets
	input *trafficInput
	// applied is the decision last applied: Segregated peers only.
	applied map[string]policy.Sets
}

// NewSegregatingDataplane wraps dp, holding until the first input held:
// the sets the kernel has from an earlier run (tunnel's PolicySets).
func NewSegregatingDataplane(dp peering.Dataplane, held []policy.Sets, log *slog.Logger) *SegregatingDataplane {
	if log == nil {
		log = slog.Default()
	}
	s := &SegregatingDataplane{Dataplane: dp, log: log, held: map[string]policy.Sets{}}
	for _, h := range held {
		s.held[h.Peer] = h
	}
	return s
}

// Apply applies d with each Segregated peer's sets, as decided last.
func (s *SegregatingDataplane) Apply(ctx context.Context, d tunnel.Desired) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &d
	allowed := s.decide(d.Peers)
	if err := s.Dataplane.Apply(ctx, segregate(d, allowed)); err != nil {
		return err
	}
	s.applied = allowed
	return nil
}

// decide is the sets of the Segregated peers among peers: held ones until
// the first input, policy's decision after. A decision refused (input the
// feed should have kept out) keeps the sets last applied, and says why.
func (s *SegregatingDataplane) decide(peers []tunnel.Peer) map[string]policy.Sets {
	out := map[string]policy.Sets{}
	if s.input == nil {
		for _, p := range peers {
			if h, ok := s.held[p.ClusterID]; ok {
				out[p.ClusterID] = h
			}
		}
		return out
	}
	in := make([]policy.Peer, 0, len(peers))
	for _, p := range peers {
		in = append(in, s.input.peer(p.ClusterID))
	}
	sets, err := policy.Decide(in)
	if err != nil {
		s.log.Error("traffic policy: input refused; the sets last applied stay", "err", err)
		return s.applied
	}
	for _, ps := range sets {
		out[ps.Peer] = ps
	}
	return out
}

// segregate returns d with each Segregated peer's sets; the others are
// Full. d's peers are not changed.
func segregate(d tunnel.Desired, allowed map[string]policy.Sets) tunnel.Desired {
	peers := slices.Clone(d.Peers)
	for i := range peers {
		if sets, ok := allowed[peers[i].ClusterID]; ok {
			peers[i].Segregated = &sets
		} else {
			peers[i].Segregated = nil
		}
	}
	d.Peers = peers
	return d
}

// setInput decides anew and, if the decision changed, applies the last
// desired state with it; applied says it did. From the first input on,
// what was held at start no longer counts.
func (s *SegregatingDataplane) setInput(ctx context.Context, in trafficInput) (applied bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.input = &in
	s.held = nil
	if s.last == nil {
		return false, nil
	}
	allowed := s.decide(s.last.Peers)
	if mapsEqualSets(allowed, s.applied) {
		return false, nil
	}
	if err := s.Dataplane.Apply(ctx, segregate(*s.last, allowed)); err != nil {
		return false, fmt.Errorf("apply the traffic policy: %w", err)
	}
	s.applied = allowed
	return true, nil
}

// allowedSets is the decision last applied for peer id; false when the
// peer is not Segregated on the data path.
func (s *SegregatingDataplane) allowedSets(id string) (policy.Sets, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sets, ok := s.applied[id]
	return sets, ok
}

func mapsEqualSets(a, b map[string]policy.Sets) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !v.Equal(w) {
			return false
		}
	}
	return true
}
