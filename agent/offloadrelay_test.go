package agent

import (
	"crypto/ed25519"
	"reflect"
	"testing"

	"github.com/flotilla-io/flotilla/peering"
)

// Offloading, made after the gossip join, learns every peer's newest
// state and grant, whether the engine said them before or after; the Peer
// writer hears everything at once.
func TestOffloadRelay(t *testing.T) {
	a := peering.PeerState{ClusterID: "a", Phase: peering.PhaseNegotiating}
	aUp := peering.PeerState{ClusterID: "a", Phase: peering.PhaseConnected}
	b := peering.PeerState{ClusterID: "b", Phase: peering.PhaseConnected}
	for _, tc := range []struct {
		name          string
		before, after []peering.PeerState
		grantBefore   bool
		wantOffload   map[string]peering.Phase
		wantGrants    []string
	}{
		{name: "nothing before", after: []peering.PeerState{a}, wantOffload: map[string]peering.Phase{"a": peering.PhaseNegotiating}},
		{name: "newest before", before: []peering.PeerState{a, aUp, b}, grantBefore: true,
			wantOffload: map[string]peering.Phase{"a": peering.PhaseConnected, "b": peering.PhaseConnected}, wantGrants: []string{"a"}},
		{name: "before and after", before: []peering.PeerState{a}, after: []peering.PeerState{aUp},
			wantOffload: map[string]peering.Phase{"a": peering.PhaseConnected}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &writtenPeers{}
			r := newOffloadRelay(nil, w)
			for _, s := range tc.before {
				r.Publish(s)
			}
			if tc.grantBefore {
				r.GrantReceived("a", ed25519.PublicKey("key"), []byte("sealed"))
			}
			off := &offloaded{states: map[string]peering.Phase{}}
			r.attach(off)
			for _, s := range tc.after {
				r.Publish(s)
			}
			if want := len(tc.before) + len(tc.after); w.published != want {
				t.Errorf("Peer writer got %d states, want %d", w.published, want)
			}
			if !reflect.DeepEqual(off.states, tc.wantOffload) {
				t.Errorf("offloading has %v, want %v", off.states, tc.wantOffload)
			}
			if !reflect.DeepEqual(off.grants, tc.wantGrants) {
				t.Errorf("offloading got grants from %v, want %v", off.grants, tc.wantGrants)
			}
		})
	}
}

type writtenPeers struct{ published int }

func (w *writtenPeers) Publish(peering.PeerState) { w.published++ }
func (w *writtenPeers) Withdraw(string)           {}
func (w *writtenPeers) Retire(string, string)     {}

type offloaded struct {
	states map[string]peering.Phase
	grants []string
}

func (o *offloaded) peerChanged(s peering.PeerState) { o.states[s.ClusterID] = s.Phase }
func (o *offloaded) GrantReceived(from string, _ ed25519.PublicKey, _ []byte) {
	o.grants = append(o.grants, from)
}
