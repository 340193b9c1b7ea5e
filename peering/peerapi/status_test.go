package peerapi

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/tunnel"
)

func sampleState() peering.PeerState {
	key, _ := tunnel.GeneratePrivateKey()
	return peering.PeerState{
		ClusterID: "crvpqgne7h7nnqsmwosiiinphle", Name: "east", Phase: peering.PhaseConnected,
		Member:      peering.Condition{OK: true, Reason: "Alive", Message: "alive member of the federation"},
		Accepted:    peering.Condition{OK: true, Reason: "Accepted", Message: "both sides accept networking"},
		ViewsAgreed: peering.Condition{OK: true, Reason: "Agreed", Message: "each side knows how the other sees it"},
		TunnelUp:    peering.Condition{OK: true, Reason: "Handshake", Message: "recent WireGuard handshake"},
		Sources:     []string{"mdns", "gossip"}, Gossip: "198.18.1.2:7946",
		Endpoint: netip.MustParseAddrPort("198.18.1.2:51820"), PublicKey: key.PublicKey(),
		TheirNetworks:       []peering.View{{Range: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("100.96.0.0/16")}},
		MyNetworks:          []peering.View{{Range: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("100.97.0.0/16")}},
		LastHandshake:       time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		StatementGeneration: 1 << 60, SpecGeneration: 4,
	}
}

func TestStatusOf(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)
	s := sampleState()
	st := statusOf(s, nil, now)
	if st.Phase != v1alpha1.PhaseConnected || st.ClusterName != "east" || st.Endpoint != "198.18.1.2:51820" || st.PublicKey != s.PublicKey.String() {
		t.Errorf("identity fields: %+v", st)
	}
	if !slices.Equal(st.Sources, []string{"mdns", "gossip"}) || st.Gossip != "198.18.1.2:7946" {
		t.Errorf("sources %v, gossip %q", st.Sources, st.Gossip)
	}
	if st.Views != "10.0.0.0/16=>100.96.0.0/16" || st.MyNetworks[0] != (v1alpha1.NetworkView{Range: "10.0.0.0/16", As: "100.97.0.0/16"}) {
		t.Errorf("views %q, mine %+v", st.Views, st.MyNetworks)
	}
	if st.LastHandshake == nil || !st.LastHandshake.Equal(&metav1.Time{Time: s.LastHandshake}) {
		t.Errorf("last handshake %v", st.LastHandshake)
	}
	if st.ObservedGeneration != 4 || st.StatementGeneration != 1<<60 {
		t.Errorf("generations: observed %d, statement %d", st.ObservedGeneration, st.StatementGeneration)
	}
	for _, kind := range []string{v1alpha1.ConditionMember, v1alpha1.ConditionAccepted, v1alpha1.ConditionViewsAgreed, v1alpha1.ConditionTunnelUp} {
		c := meta.FindStatusCondition(st.Conditions, kind)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 4 || !c.LastTransitionTime.Time.Equal(now) {
			t.Errorf("condition %s: %+v", kind, c)
		}
	}

	s.LastHandshake = time.Time{}
	if st := statusOf(s, nil, now); st.LastHandshake != nil {
		t.Errorf("no handshake written as %v", st.LastHandshake)
	}
}

// A condition keeps its transition time while its status stays; it moves
// when the status flips, whatever the reason says.
func TestStatusKeepsTransitionTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	s := sampleState()
	prev := statusOf(s, nil, t0).Conditions
	s.TunnelUp = peering.Condition{OK: false, Reason: "NoHandshake", Message: "configured; no recent WireGuard handshake"}
	s.Member.Message = "still alive"
	st := statusOf(s, prev, t1)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionMember); !c.LastTransitionTime.Time.Equal(t0) || c.Message != "still alive" {
		t.Errorf("unchanged Member: %+v, want the transition time of %v and the new message", c, t0)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionTunnelUp); !c.LastTransitionTime.Time.Equal(t1) || c.Reason != "NoHandshake" {
		t.Errorf("flipped TunnelUp: %+v, want transition at %v", c, t1)
	}
}

// Every phase the engine emits is one the CRD accepts.
func TestPhasesAreAPIPhases(t *testing.T) {
	api := []v1alpha1.Phase{v1alpha1.PhaseDiscovered, v1alpha1.PhaseNegotiating, v1alpha1.PhaseConnected,
		v1alpha1.PhaseDegraded, v1alpha1.PhaseUnreachable, v1alpha1.PhaseDenied}
	for _, ph := range peering.Phases {
		if !slices.Contains(api, v1alpha1.Phase(ph)) {
			t.Errorf("phase %q is not a v1alpha1 phase", ph)
		}
	}
}

func TestSpecOf(t *testing.T) {
	for _, tt := range []struct {
		in   v1alpha1.Networking
		want peering.Networking
	}{
		{v1alpha1.NetworkingDefault, peering.NetworkingDefault},
		{v1alpha1.NetworkingAccept, peering.NetworkingAccept},
		{v1alpha1.NetworkingDeny, peering.NetworkingDeny},
	} {
		p := &v1alpha1.Peer{Spec: v1alpha1.PeerSpec{Networking: tt.in}}
		p.Generation = 7
		if got := specOf(p); got != (peering.Spec{Networking: tt.want, Generation: 7}) {
			t.Errorf("specOf(%q) = %+v", tt.in, got)
		}
	}
}
