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

// flowMatch selects conntrack entries by their addresses; a zero prefix
// matches anything. All set fields must match.
type flowMatch struct {
	origSrc, origDst, replyDst netip.Prefix
}

// staleFlows lists what selects the flows that old's mappings made and
// now's no longer make, peer by peer:
//   - a view of the peer that is gone or maps another network: every flow
//     from or to it (ingress from the peer has its source there, egress to
//     the peer its destination);
//   - a view of me that the peer no longer has: the flows between the
//     peer's kept views and the old range, ingress by its original
//     destination, egress by the source it was translated to.
func staleFlows(old, now Desired) []flowMatch {
	peers := make(map[string]Peer, len(now.Peers))
	for _, p := range now.Peers {
		peers[p.ClusterID] = p
	}
	var out []flowMatch
	for _, was := range old.Peers {
		is := peers[was.ClusterID]
		var kept []netip.Prefix
		for _, v := range was.Views {
			if slices.Contains(is.Views, v) {
				kept = append(kept, v.As)
				continue
			}
			out = append(out, flowMatch{origSrc: v.As}, flowMatch{origDst: v.As})
		}
		for _, w := range was.ViewsOfMe {
			if slices.Contains(is.ViewsOfMe, w) {
				continue
			}
			for _, v := range kept {
				out = append(out, flowMatch{origSrc: v, origDst: w.As}, flowMatch{origDst: v, replyDst: w.As})
			}
		}
	}
	return out
}

// flushFlows deletes the conntrack entries that any of ms selects and
// returns how many.
func flushFlows(ms []flowMatch) (uint, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	filters := make([]netlink.CustomConntrackFilter, 0, len(ms))
	for _, m := range ms {
		f := &netlink.ConntrackFilter{}
		for _, sel := range []struct {
			kind netlink.ConntrackFilterType
			p    netip.Prefix
		}{
			{netlink.ConntrackOrigSrcIP, m.origSrc},
			{netlink.ConntrackOrigDstIP, m.origDst},
			{netlink.ConntrackReplyDstIP, m.replyDst},
		} {
			if !sel.p.IsValid() {
				continue
			}
			ipnet := &net.IPNet{IP: sel.p.Addr().AsSlice(), Mask: net.CIDRMask(sel.p.Bits(), 32)}
			if err := f.AddIPNet(sel.kind, ipnet); err != nil {
				return 0, fmt.Errorf("conntrack filter for %s: %w", sel.p, err)
			}
		}
		filters = append(filters, f)
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, filters...)
	if err != nil {
		return n, fmt.Errorf("delete conntrack entries of released views: %w", err)
	}
	return n, nil
}
