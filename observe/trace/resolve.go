package trace

import (
	"fmt"
	"net/netip"
	"strings"
)

// findPod resolves s in c: an address (a pod's, or any), namespace/name,
// or a name unique across namespaces.
func findPod(c *Cluster, s string) (*Pod, netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			return nil, netip.Addr{}, fmt.Errorf("%s: only IPv4 is traced", s)
		}
		return c.podAt(a), a, nil
	}
	ns, name, qualified := strings.Cut(s, "/")
	if !qualified {
		name, ns = s, ""
	}
	var found []*Pod
	for i := range c.Pods {
		p := &c.Pods[i]
		if p.Name == name && (ns == "" || p.Namespace == ns) {
			found = append(found, p)
		}
	}
	switch {
	case len(found) == 0:
		return nil, netip.Addr{}, fmt.Errorf("no pod %s in %s", s, clusterName(c))
	case len(found) > 1:
		return nil, netip.Addr{}, fmt.Errorf("pod %s is in %d namespaces of %s: give namespace/name", s, len(found), clusterName(c))
	case !found[0].IP.IsValid():
		return nil, netip.Addr{}, fmt.Errorf("pod %s/%s in %s has no address yet", found[0].Namespace, found[0].Name, clusterName(c))
	}
	return found[0], found[0].IP, nil
}

func (c *Cluster) podAt(a netip.Addr) *Pod {
	for i := range c.Pods {
		if c.Pods[i].IP == a {
			return &c.Pods[i]
		}
	}
	return nil
}

// nodeOf is the worker node an address lives on (its pod's node, else the
// node whose pod block holds it); nil for the gateway and for addresses
// no node claims, which then count as the gateway's (a cluster without
// the fabric routes everything through its gateway).
func (c *Cluster) nodeOf(pod *Pod, a netip.Addr) *Node {
	var n *Node
	if pod != nil && pod.Node != "" {
		n = c.node(pod.Node)
	}
	if n == nil {
		for i := range c.Nodes {
			if containsAddr(c.Nodes[i].PodBlocks, a) {
				n = &c.Nodes[i]
			}
		}
	}
	if n == nil || n.Name == c.Gateway || c.Gateway == "" {
		return nil
	}
	return n
}

func (c *Cluster) node(name string) *Node {
	for i := range c.Nodes {
		if c.Nodes[i].Name == name {
			return &c.Nodes[i]
		}
	}
	return nil
}

// gateway is the gateway node; a cluster whose gateway is unnamed (no
// fabric) has it as its one node.
func (c *Cluster) gateway() *Node {
	if n := c.node(c.Gateway); n != nil {
		return n
	}
	if c.Gateway == "" && len(c.Nodes) == 1 {
		return &c.Nodes[0]
	}
	return nil
}

func (c *Cluster) peer(id, name string) *Peer {
	for i := range c.Peers {
		if c.Peers[i].is(id, name) {
			return &c.Peers[i]
		}
	}
	return nil
}

// peerByView finds the peer one of whose views holds a, and the address
// in the peer's own terms.
func (c *Cluster) peerByView(a netip.Addr) (*Peer, netip.Addr) {
	for i := range c.Peers {
		if real, ok := translate(a, c.Peers[i].Theirs, true); ok {
			return &c.Peers[i], real
		}
	}
	return nil, netip.Addr{}
}

// peerByReal finds the peer that owns a by its own numbering, and the
// address in c's terms. Several peers may number alike; the one of other
// (the peer cluster given) wins, else the first.
func (c *Cluster) peerByReal(a netip.Addr, other *Cluster) (*Peer, netip.Addr) {
	var first *Peer
	var firstView netip.Addr
	for i := range c.Peers {
		p := &c.Peers[i]
		v, ok := translate(a, p.Theirs, false)
		if !ok {
			continue
		}
		if other != nil && p.is(other.ID, other.Name) {
			return p, v
		}
		if first == nil {
			first, firstView = p, v
		}
	}
	return first, firstView
}

// local reports whether a is one of c's own pod addresses.
func (c *Cluster) local(a netip.Addr) bool {
	if c.podAt(a) != nil {
		return true
	}
	for _, n := range c.Nodes {
		if containsAddr(n.PodBlocks, a) {
			return true
		}
	}
	for _, p := range c.Peers {
		for _, v := range p.Mine {
			if v.Real.Contains(a) {
				return true
			}
		}
	}
	return false
}

func (c *Cluster) unread(what string) string {
	if why, ok := c.Unread[what]; ok {
		return why
	}
	return "not given"
}

func (t *Tunnel) nat(peer string) *PeerNAT {
	for i := range t.NAT {
		if t.NAT[i].Peer == peer {
			return &t.NAT[i]
		}
	}
	return nil
}

// allowing is the WireGuard peer whose allowed IPs hold a (WireGuard
// routes by the longest of them).
func (t *Tunnel) allowing(a netip.Addr) *WGPeer {
	var best *WGPeer
	bits := -1
	for i := range t.WireGuard {
		for _, p := range t.WireGuard[i].AllowedIPs {
			if p.Contains(a) && p.Bits() > bits {
				best, bits = &t.WireGuard[i], p.Bits()
			}
		}
	}
	return best
}

// translate maps a through the view that holds it: from As to Real when
// fromView, else from Real to As.
func translate(a netip.Addr, vs []View, fromView bool) (netip.Addr, bool) {
	for _, v := range vs {
		from, to := v.Real, v.As
		if fromView {
			from, to = v.As, v.Real
		}
		if samePlace(from, to) && from.Contains(a) {
			return mapAddr(a, from, to), true
		}
	}
	return netip.Addr{}, false
}

func translateT(a netip.Addr, ts []Translation) (netip.Addr, bool) {
	for _, t := range ts {
		if samePlace(t.Match, t.To) && t.Match.Contains(a) {
			return mapAddr(a, t.Match, t.To), true
		}
	}
	return netip.Addr{}, false
}

// samePlace: from and to are IPv4 prefixes of one length, so an address
// maps from one into the other (what another cluster wrote may not be).
func samePlace(from, to netip.Prefix) bool {
	return from.IsValid() && to.IsValid() && from.Addr().Is4() && to.Addr().Is4() && from.Bits() == to.Bits()
}

// mapAddr keeps a's host bits under from and puts to's network bits on
// them.
func mapAddr(a netip.Addr, from, to netip.Prefix) netip.Addr {
	ab, tb := a.As4(), to.Addr().As4()
	bits := from.Bits()
	var out [4]byte
	for i := range 4 {
		keep := byte(0)
		switch {
		case bits >= 8*(i+1):
			keep = 0xff
		case bits > 8*i:
			keep = byte(0xff << (8 - (bits - 8*i)))
		}
		out[i] = tb[i]&keep | ab[i]&^keep
	}
	return netip.AddrFrom4(out)
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func views(vs []View) string {
	if len(vs) == 0 {
		return "none"
	}
	var s []string
	for _, v := range vs {
		s = append(s, v.Real.String()+" as "+v.As.String())
	}
	return strings.Join(s, ", ")
}

func prefixes(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "nothing"
	}
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// Candidates are the addresses a destination may have in the peer's
// terms: itself, and what each of local's views of its peers maps it to.
// The command looks up the peer's pods at them.
func Candidates(local *Cluster, dst string) []netip.Addr {
	a, err := netip.ParseAddr(dst)
	if err != nil {
		return nil
	}
	out := []netip.Addr{a}
	for _, p := range local.Peers {
		if real, ok := translate(a, p.Theirs, true); ok && real != a {
			out = append(out, real)
		}
	}
	return out
}

// Name gives the clusters their names as each other's Peers know them,
// where they were only known by a kubeconfig's context.
func Name(a, b *Cluster) {
	if b == nil {
		return
	}
	if p := b.peer(a.ID, ""); p != nil && p.Name != "" {
		a.Name = p.Name
	}
	if p := a.peer(b.ID, ""); p != nil && p.Name != "" {
		b.Name = p.Name
	}
}
