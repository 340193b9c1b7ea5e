package tunnel

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A connection's NAT is decided on its first packet and kept in its
// conntrack entry for as long as the flow lives. When a view is released
// or remapped, flows set up under the old mapping would keep using an
// address that may now be another peer's, or a translation the peer no
// longer undoes; so Apply deletes their entries, and their next packet
// is translated afresh (or dropped) under the new mapping.

// flowMatch selects the conntrack entries whose addresses are in all its
// set prefixes; a zero prefix matches anything.
type flowMatch struct {
	origSrc, origDst, replyDst netip.Prefix
}

func (m flowMatch) matches(f *netlink.ConntrackFlow) bool {
	in := func(p netip.Prefix, ip net.IP) bool {
		a, ok := netip.AddrFromSlice(ip)
		return !p.IsValid() || ok && p.Contains(a.Unmap())
	}
	return in(m.origSrc, f.Forward.SrcIP) && in(m.origDst, f.Forward.DstIP) && in(m.replyDst, f.Reverse.DstIP)
}

// stale selects the flows that one desired state's mappings made and the
// next one's no longer make. It is one conntrack filter: a table of many
// flows is read once and each flow costs a binary search, however many
// peers went.
type stale struct {
	// views are released views of peers, sorted and disjoint: flows from
	// or to them.
	views []netip.Prefix
	// pairs select flows between a peer's kept view and a view of me it
	// no longer has.
	pairs []flowMatch
}

// staleFlows compares old and now peer by peer:
//   - a view of the peer that is gone or maps another network: every flow
//     from or to it (ingress from the peer has its source there, egress to
//     the peer its destination);
//   - a view of me that the peer no longer has: the flows between the
//     peer's kept views and the old range, ingress by its original
//     destination, egress by the source it was translated to.
func staleFlows(old, now Desired) stale {
	peers := make(map[string]Peer, len(now.Peers))
	for _, p := range now.Peers {
		peers[p.ClusterID] = p
	}
	var s stale
	for _, was := range old.Peers {
		is := peers[was.ClusterID]
		var kept []netip.Prefix
		for _, v := range was.Views {
			if slices.Contains(is.Views, v) {
				kept = append(kept, v.As)
				continue
			}
			s.views = append(s.views, v.As)
		}
		for _, w := range was.ViewsOfMe {
			if slices.Contains(is.ViewsOfMe, w) {
				continue
			}
			for _, v := range kept {
				s.pairs = append(s.pairs, flowMatch{origSrc: v, origDst: w.As}, flowMatch{origDst: v, replyDst: w.As})
			}
		}
	}
	slices.SortFunc(s.views, comparePrefix)
	return s
}

func (s stale) empty() bool { return len(s.views) == 0 && len(s.pairs) == 0 }

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (s stale) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if inViews(s.views, f.Forward.SrcIP) || inViews(s.views, f.Forward.DstIP) {
		return true
	}
	for _, m := range s.pairs {
		if m.matches(f) {
			return true
		}
	}
	return false
}

// inViews reports whether ip is in one of the sorted, disjoint prefixes.
func inViews(views []netip.Prefix, ip net.IP) bool {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return false
	}
	a = a.Unmap()
	// The last prefix starting at or before a is the only one that may hold it.
	i, _ := slices.BinarySearchFunc(views, a, func(p netip.Prefix, a netip.Addr) int {
		if p.Addr().Compare(a) <= 0 {
			return -1
		}
		return 1
	})
	return i > 0 && views[i-1].Contains(a)
}

// flushFlows deletes the conntrack entries s selects and returns how many.
func flushFlows(s stale) (uint, error) {
	if s.empty() {
		return 0, nil
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, s)
	if err != nil {
		return n, fmt.Errorf("delete conntrack entries of released views: %w", err)
	}
	return n, nil
}
