package tunnel

import (
	"fmt"
	"net/netip"
	"sort"
)

// NATKind says which address a NAT rule rewrites.
type NATKind string

const (
	// SNAT rewrites the source of packets leaving into the tunnel: my real
	// network becomes the peer's view of it.
	SNAT NATKind = "snat"
	// DNAT rewrites the destination of packets arriving from the tunnel:
	// the peer's view of my network becomes my real network.
	DNAT NATKind = "dnat"
)

// NATRule is one prefix translation for one peer. A packet whose source is
// in Source and destination in Destination gets the address named by Kind
// mapped, host bits kept, into To.
type NATRule struct {
	Peer        string
	Kind        NATKind
	Source      netip.Prefix
	Destination netip.Prefix
	To          netip.Prefix
}

// Key identifies the rule by everything it matches and does; the tunnel
// stores it as the rule's comment and compares rules by it.
func (r NATRule) Key() string {
	return fmt.Sprintf("flotilla peer=%s %s src=%s dst=%s to=%s", r.Peer, r.Kind, r.Source, r.Destination, r.To)
}

// NATRules computes the prefix NAT the desired state needs, per peer and
// in a stable order: for every network of mine the peer sees under another
// range, an SNAT on egress keyed by the destination in each of my views of
// the peer, and a DNAT on ingress keyed by the source in those views.
// Ingress keys on the source because different peers may see me under the
// same range. Where a peer sees my network as it is, no rule is needed.
func NATRules(d Desired) []NATRule {
	var rules []NATRule
	for _, p := range d.Peers {
		rules = append(rules, peerNATRules(p)...)
	}
	return rules
}

func peerNATRules(p Peer) []NATRule {
	var rules []NATRule
	views := append([]View(nil), p.Views...)
	sort.Slice(views, func(i, j int) bool { return views[i].As.Addr().Less(views[j].As.Addr()) })
	ofMe := append([]View(nil), p.ViewsOfMe...)
	sort.Slice(ofMe, func(i, j int) bool { return ofMe[i].Real.Addr().Less(ofMe[j].Real.Addr()) })
	for _, mine := range ofMe {
		if mine.As == mine.Real {
			continue
		}
		for _, theirs := range views {
			rules = append(rules,
				NATRule{Peer: p.ClusterID, Kind: SNAT, Source: mine.Real, Destination: theirs.As, To: mine.As},
				NATRule{Peer: p.ClusterID, Kind: DNAT, Source: theirs.As, Destination: mine.As, To: mine.Real},
			)
		}
	}
	return rules
}

// Routes lists the destinations routed into the tunnel: my views of every
// peer's networks.
func Routes(d Desired) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range d.Peers {
		for _, v := range p.Views {
			out = append(out, v.As)
		}
	}
	return out
}
