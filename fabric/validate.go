package fabric

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flotilla-io/flotilla/ipam"
)

func (d Desired) clone() Desired {
	d.Views = slices.Clone(d.Views)
	nodes := make([]Node, len(d.Nodes))
	for i, n := range d.Nodes {
		nodes[i] = Node{Addr: n.Addr, PodCIDRs: slices.Clone(n.PodCIDRs)}
	}
	d.Nodes = nodes
	return d
}

// validate refuses what the fabric cannot route: anything but IPv4,
// prefixes with host bits set, and ranges that overlap, which would make
// a destination ambiguous.
func (d Desired) validate() error {
	if d.Addr.IsValid() && !d.Addr.Is4() {
		return fmt.Errorf("node address %s: want this node's IPv4 address on the node network", d.Addr)
	}
	var ranges []named
	for _, v := range d.Views {
		if err := ipam.CheckIPv4Range("view", v); err != nil {
			return err
		}
		ranges = append(ranges, named{"view " + v.String(), v})
	}
	switch d.Role {
	case Worker:
		if !d.Gateway.IsValid() || !d.Gateway.Is4() {
			return fmt.Errorf("gateway address %q: want the gateway node's IPv4 address on the node network", d.Gateway)
		}
		for _, v := range d.Views {
			if v.Contains(d.Gateway) {
				return fmt.Errorf("gateway address %s is inside view %s: the route to the view could not reach it; check the gateway address", d.Gateway, v)
			}
		}
		if d.MTU != 0 && (d.MTU < 1280 || d.MTU > 65535) {
			return fmt.Errorf("mtu %d out of range 1280..65535 (0 sets none)", d.MTU)
		}
		if s := d.HostSource; s.IsValid() {
			if !s.Is4() || s.IsLoopback() || s.IsUnspecified() || s.IsMulticast() {
				return fmt.Errorf("host source %s: want an IPv4 unicast address of this node's pod block", s)
			}
			if s == d.Gateway {
				return fmt.Errorf("host source %s is the gateway's address", s)
			}
			for _, v := range d.Views {
				if v.Contains(s) {
					return fmt.Errorf("host source %s is inside view %s: want an address of this node's pod block", s, v)
				}
			}
		}
	case Gateway:
		if d.TunnelInterface == "" || len(d.TunnelInterface) >= 16 || strings.ContainsAny(d.TunnelInterface, "/ \t\n") {
			return fmt.Errorf("tunnel interface %q: want the WireGuard link's name, 1 to 15 characters, no '/' or spaces", d.TunnelInterface)
		}
		for _, n := range d.Nodes {
			if !n.Addr.IsValid() || !n.Addr.Is4() {
				return fmt.Errorf("node address %q: want the node's IPv4 address on the node network", n.Addr)
			}
			for _, b := range n.PodCIDRs {
				if err := ipam.CheckIPv4Range(fmt.Sprintf("pod block of node %s", n.Addr), b); err != nil {
					return err
				}
				ranges = append(ranges, named{fmt.Sprintf("pod block %s of node %s", b, n.Addr), b})
			}
		}
	default:
		return fmt.Errorf("role %q: want %q or %q", d.Role, Worker, Gateway)
	}
	return disjoint(ranges)
}

// named is a range with what it is, for errors.
type named struct {
	what string
	p    netip.Prefix
}

// disjoint refuses two ranges that overlap (a repeated range included).
func disjoint(rs []named) error {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b named) int {
		if c := a.p.Addr().Compare(b.p.Addr()); c != 0 {
			return c
		}
		return a.p.Bits() - b.p.Bits()
	})
	// Prefixes nest or are disjoint: sorted by start, if any two overlap,
	// two neighbours do.
	for i := 1; i < len(rs); i++ {
		if rs[i-1].p.Overlaps(rs[i].p) {
			return fmt.Errorf("%s overlaps %s: every range must be disjoint", rs[i-1].what, rs[i].what)
		}
	}
	return nil
}
