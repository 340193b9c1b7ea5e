package tunnel

import (
	"net/netip"
	"reflect"
	"testing"
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
		want   []flowMatch
	}{
		{"nothing changed", func(*Desired) {}, nil},
		{"peer removed: all its flows, none of the other's", func(d *Desired) { d.Peers = d.Peers[1:] },
			[]flowMatch{{origSrc: pfx("10.70.0.0/16")}, {origDst: pfx("10.70.0.0/16")}}},
		{"my view of the peer remapped", func(d *Desired) { d.Peers[0].Views[0].As = pfx("10.75.0.0/16") },
			[]flowMatch{{origSrc: pfx("10.70.0.0/16")}, {origDst: pfx("10.70.0.0/16")}}},
		{"the peer's view of me remapped: only its flows with the old range", func(d *Desired) {
			d.Peers[0].ViewsOfMe[0].As = pfx("10.76.0.0/16")
		}, []flowMatch{
			{origSrc: pfx("10.70.0.0/16"), origDst: pfx("10.71.0.0/16")},
			{origDst: pfx("10.70.0.0/16"), replyDst: pfx("10.71.0.0/16")},
		}},
		{"the peer's view of me no longer remapped", func(d *Desired) {
			d.Peers[0].ViewsOfMe[0].As = pfx("10.0.0.0/16")
		}, []flowMatch{
			{origSrc: pfx("10.70.0.0/16"), origDst: pfx("10.71.0.0/16")},
			{origDst: pfx("10.70.0.0/16"), replyDst: pfx("10.71.0.0/16")},
		}},
		{"the peer's views reordered", func(d *Desired) {
			d.Peers[0], d.Peers[1] = d.Peers[1], d.Peers[0]
		}, nil},
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
