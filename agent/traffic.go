package agent

// Segregated traffic (issue 16, docs/policy.md): the agent's side, begun.
// What is here turns Kubernetes state into policy's plain input and puts
// policy's decision into every data path applied. It is NOT yet connected
// to the engine or fed by informers: until the pods and Services of every
// peer are fed, enforcing Segregated would drop traffic to pods that are
// allowed, so no peer is Segregated on the data path yet.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
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

// offloadedPods maps the pods running here for consumers to the consumer
// they belong to, by the tenant label of their namespace. Only pods with
// an IP of their own count: a hostNetwork pod's IP is its node's, which
// must never be opened to a peer.
func offloadedPods(namespaces []corev1.Namespace, pods []corev1.Pod) map[string][]netip.Addr {
	tenantOf := map[string]string{}
	for _, ns := range namespaces {
		if c := ns.Labels[offload.LabelTenant]; c != "" && ns.Labels[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue {
			tenantOf[ns.Name] = c
		}
	}
	out := map[string][]netip.Addr{}
	for _, p := range pods {
		c, ok := tenantOf[p.Namespace]
		if !ok || p.Spec.HostNetwork {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() {
				out[c] = append(out[c], a)
			}
		}
	}
	return out
}

// trafficInput is what the agent knows, per peer, for policy.Decide.
type trafficInput struct {
	Modes    map[string]policy.Mode
	Pods     map[string][]netip.Addr
	Services map[string][]policy.Service
}

func (in trafficInput) peers() []policy.Peer {
	var out []policy.Peer
	for id, mode := range in.Modes {
		out = append(out, policy.Peer{ID: id, Mode: mode, Pods: in.Pods[id], Services: in.Services[id]})
	}
	slices.SortFunc(out, func(a, b policy.Peer) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// segregatingDataplane puts the decision of policy into every desired
// state the engine applies, and applies the last one again when the
// decision changes without the engine applying anything.
type segregatingDataplane struct {
	peering.Dataplane

	mu      sync.Mutex
	last    *tunnel.Desired
	allowed map[string]policy.Sets // Segregated peers only
}

func (s *segregatingDataplane) Apply(ctx context.Context, d tunnel.Desired) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &d
	return s.Dataplane.Apply(ctx, s.segregate(d))
}

// segregate returns d with each Segregated peer's sets. Peers of d the
// policy does not know stay Full.
func (s *segregatingDataplane) segregate(d tunnel.Desired) tunnel.Desired {
	peers := slices.Clone(d.Peers)
	for i := range peers {
		if sets, ok := s.allowed[peers[i].ClusterID]; ok {
			peers[i].Segregated = &sets
		} else {
			peers[i].Segregated = nil
		}
	}
	d.Peers = peers
	return d
}

// setInput decides anew and, if the decision changed, applies the last
// desired state with it. Bad input changes nothing and is returned.
func (s *segregatingDataplane) setInput(ctx context.Context, in trafficInput) error {
	sets, err := policy.Decide(in.peers())
	if err != nil {
		return fmt.Errorf("traffic policy: %w", err)
	}
	allowed := make(map[string]policy.Sets, len(sets))
	for _, ps := range sets {
		allowed[ps.Peer] = ps
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if mapsEqualSets(allowed, s.allowed) {
		return nil
	}
	s.allowed = allowed
	if s.last == nil {
		return nil
	}
	return s.Dataplane.Apply(ctx, s.segregate(*s.last))
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
