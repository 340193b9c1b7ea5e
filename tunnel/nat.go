package tunnel

import (
	"fmt"
	"net/netip"
	"slices"
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

// NATRule is one prefix translation applied to one peer's packets. An SNAT
// rule matches the source, a DNAT rule the destination, against Match, and
// maps that address, host bits kept, into To.
type NATRule struct {
	Kind  NATKind
	Match netip.Prefix
	To    netip.Prefix
}

// PeerNAT is the prefix NAT for one peer. Packets into the tunnel whose
// destination is in one of Views, and packets out of it whose source is in
// one of Views, are this peer's, and only they meet its Rules. Keying on
// my views of the peer is what lets different peers see me under the same
// range.
type PeerNAT struct {
	Peer  string
	Views []netip.Prefix // my views of the peer's networks, sorted
	Rules []NATRule      // SNAT and DNAT per remapped network of mine
}

// Key identifies a rule of a peer by everything it matches and does; the
// tunnel stores it as the rule's comment and compares rules by it.
func (r NATRule) Key(peer string) string {
	return fmt.Sprintf("flotilla peer=%s %s %s to %s", peer, r.Kind, r.Match, r.To)
}

// NAT computes the prefix NAT the desired state needs, one entry per peer
// that sees any network of mine, in the order of d.Peers. For every network
// of mine the peer sees under another range there is an SNAT (my real ->
// the peer's view of me) for packets to the peer and a DNAT (the peer's
// view of me -> my real) for packets from it. A network the peer sees as
// it is gets an identity SNAT (my real -> my real): it changes nothing,
// but a source NAT bound by our chain is one no later NAT chain, such as
// a CNI's masquerade, can make, and without it traffic to the peer would
// be masqueraded out of a link that has no address to masquerade to.
func NAT(d Desired) []PeerNAT {
	var out []PeerNAT
	for _, p := range d.Peers {
		if pn, ok := peerNAT(p); ok {
			out = append(out, pn)
		}
	}
	return out
}

func peerNAT(p Peer) (PeerNAT, bool) {
	ofMe := slices.Clone(p.ViewsOfMe)
	slices.SortFunc(ofMe, func(a, b View) int { return comparePrefix(a.Real, b.Real) })
	pn := PeerNAT{Peer: p.ClusterID}
	for _, mine := range ofMe {
		if mine.As == mine.Real {
			pn.Rules = append(pn.Rules, NATRule{Kind: SNAT, Match: mine.Real, To: mine.Real})
			continue
		}
		pn.Rules = append(pn.Rules,
			NATRule{Kind: SNAT, Match: mine.Real, To: mine.As},
			NATRule{Kind: DNAT, Match: mine.As, To: mine.Real},
		)
	}
	if len(pn.Rules) == 0 {
		return PeerNAT{}, false
	}
	for _, v := range p.Views {
		pn.Views = append(pn.Views, v.As)
	}
	slices.SortFunc(pn.Views, comparePrefix)
	return pn, true
}

// equal reports whether a and b make the same kernel objects.
func (a PeerNAT) equal(b PeerNAT) bool {
	return a.Peer == b.Peer && slices.Equal(a.Views, b.Views) && slices.Equal(a.Rules, b.Rules)
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
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
