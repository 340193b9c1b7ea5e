package tunnel

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestStaleFlows(t *testing.T) {
	b := func() Peer {
		return Peer{ClusterID: "b", PublicKey: Key{1},
			Views:     []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.70.0.0/16")}},
			ViewsOfMe: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.71.0.0/16")}}}
	}
	c := Peer{ClusterID: "c", PublicKey: Key{2},
		Views:     []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.72.0.0/16")}},
		ViewsOfMe: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.71.0.0/16")}}}
	old := Desired{Networks: []netip.Prefix{pfx("10.0.0.0/16")}, Peers: []Peer{b(), c}}
	tests := []struct {
		name   string
		change func(*Desired)
		want   stale
	}{
		{"nothing changed", func(*Desired) {}, stale{}},
		{"peers removed: all their flows", func(d *Desired) { d.Peers = nil },
			stale{views: []netip.Prefix{pfx("10.70.0.0/16"), pfx("10.72.0.0/16")}}},
		{"peer removed: all its flows, none of the other's", func(d *Desired) { d.Peers = d.Peers[1:] },
			stale{views: []netip.Prefix{pfx("10.70.0.0/16")}}},
		{"my view of the peer remapped", func(d *Desired) { d.Peers[0].Views[0].As = pfx("10.75.0.0/16") },
			stale{views: []netip.Prefix{pfx("10.70.0.0/16")}}},
		{"the peer's view of me remapped: only its flows with the old range", func(d *Desired) {
			d.Peers[0].ViewsOfMe[0].As = pfx("10.76.0.0/16")
		}, stale{pairs: []flowMatch{
			{origSrc: pfx("10.70.0.0/16"), origDst: pfx("10.71.0.0/16")},
			{origDst: pfx("10.70.0.0/16"), replyDst: pfx("10.71.0.0/16")},
		}}},
		{"the peer's view of me no longer remapped", func(d *Desired) {
			d.Peers[0].ViewsOfMe[0].As = pfx("10.0.0.0/16")
		}, stale{pairs: []flowMatch{
			{origSrc: pfx("10.70.0.0/16"), origDst: pfx("10.71.0.0/16")},
			{origDst: pfx("10.70.0.0/16"), replyDst: pfx("10.71.0.0/16")},
		}}},
		{"the peers reordered", func(d *Desired) {
			d.Peers[0], d.Peers[1] = d.Peers[1], d.Peers[0]
		}, stale{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := cloneDesired(old)
			tc.change(&now)
			if err := now.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := staleFlows(old, now); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// The filter selects a flow by its original source or destination in a
// released view, or by a pair; nothing else.
func TestStaleMatchesFlows(t *testing.T) {
	s := stale{
		views: []netip.Prefix{pfx("10.70.0.0/16"), pfx("10.72.0.0/24"), pfx("10.72.1.0/24")},
		pairs: []flowMatch{{origDst: pfx("10.80.0.0/16"), replyDst: pfx("10.71.0.0/16")}},
	}
	flow := func(src, dst, replyDst string) *netlink.ConntrackFlow {
		return &netlink.ConntrackFlow{
			Forward: netlink.IPTuple{SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst)},
			Reverse: netlink.IPTuple{SrcIP: net.ParseIP(dst), DstIP: net.ParseIP(replyDst)},
		}
	}
	tests := []struct {
		name string
		f    *netlink.ConntrackFlow
		want bool
	}{
		{"egress to a released view", flow("10.0.1.5", "10.70.2.6", "10.71.1.5"), true},
		{"ingress from a released view", flow("10.70.2.6", "10.71.1.5", "10.70.2.6"), true},
		{"the last address of a released view", flow("10.0.1.5", "10.72.1.255", "10.0.1.5"), true},
		{"just past a released view", flow("10.0.1.5", "10.72.2.0", "10.0.1.5"), false},
		{"just before the first released view", flow("10.0.1.5", "10.69.255.255", "10.0.1.5"), false},
		{"egress to a kept view translated into a released view of me", flow("10.0.1.5", "10.80.0.9", "10.71.1.5"), true},
		{"egress to a kept view translated into a kept view of me", flow("10.0.1.5", "10.80.0.9", "10.73.1.5"), false},
		{"unrelated", flow("169.254.1.1", "10.0.1.5", "169.254.1.1"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.MatchConntrackFlow(tc.f); got != tc.want {
				t.Errorf("MatchConntrackFlow = %v, want %v", got, tc.want)
			}
		})
	}
}
