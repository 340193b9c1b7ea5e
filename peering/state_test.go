package peering

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The state says which spec the engine acted on: a state carrying a spec's
// generation already shows that spec's decision.
func TestStateNamesTheSpecActedOn(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	if g := stateOf(a, b).SpecGeneration; g != 0 {
		t.Fatalf("generation %d before any spec", g)
	}
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Generation: 1})
	within(t, "generation 1 acted on", func() error {
		if g := stateOf(a, b).SpecGeneration; g != 1 {
			return fmt.Errorf("generation %d", g)
		}
		return nil
	})
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Networking: NetworkingDeny, Generation: 2})
	inPhase(t, a, b, PhaseDenied)
	for _, ev := range a.rec.history(b.id.ClusterID()) {
		s := ev.state
		if s.SpecGeneration == 2 && s.Accepted.Reason != "DeniedHere" {
			t.Fatalf("a state names generation 2 but does not act on it: %+v", s.Accepted)
		}
		if s.SpecGeneration < 2 && s.Accepted.Reason == "DeniedHere" {
			t.Fatalf("a state acts on generation 2 but names %d", s.SpecGeneration)
		}
	}
}

// Sources are what found the member, not a constant.
func TestStateCarriesSources(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	m := b.member(true)
	m.Sources = []string{"mdns", "seed"}
	a.eng.MemberChanged(m)
	within(t, "sources in a's state of b", func() error {
		if s := stateOf(a, b); !slices.Equal(s.Sources, []string{"mdns", "seed"}) {
			return fmt.Errorf("sources %v", s.Sources)
		}
		return nil
	})
}

// A data path that fails to apply is reported, not hidden behind an old
// handshake.
func TestApplyFailureIsDegraded(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	b.dp.handshake(a.id.ClusterID(), time.Now())
	inPhase(t, b, a, PhaseConnected)
	// From now on b's kernel refuses; a third cluster gives b something
	// new to apply.
	b.dp.setFailing(errors.New("nftables: operation not permitted"))
	c := newNode(t, net, nodeOptions{})
	meet(a, b, c)
	s := inPhase(t, b, a, PhaseDegraded)
	if s.TunnelUp.OK || s.TunnelUp.Reason != "ApplyFailed" || !strings.Contains(s.TunnelUp.Message, "operation not permitted") {
		t.Fatalf("TunnelUp %+v, want ApplyFailed with the kernel's error", s.TunnelUp)
	}
	if v := testutil.ToFloat64(b.eng.metrics.applyErrors); v == 0 {
		t.Fatal("failed apply not counted")
	}
}

// A configured tunnel is Negotiating until WireGuard reports a handshake,
// Degraded when none comes within 30 s, and Connected once one does.
func TestNoHandshakeIsDegraded(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a, b := newNode(t, net, nodeOptions{clock: clk}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	s := inPhase(t, a, b, PhaseNegotiating)
	if s.TunnelUp.Reason != "NoHandshake" || !s.LastHandshake.IsZero() {
		t.Fatalf("before any handshake: TunnelUp %+v, last handshake %v", s.TunnelUp, s.LastHandshake)
	}
	clk.Add(31 * time.Second)
	s = inPhase(t, a, b, PhaseDegraded)
	if s.TunnelUp.Reason != "NoHandshake" {
		t.Fatalf("TunnelUp %+v, want NoHandshake", s.TunnelUp)
	}
	at := clk.Now()
	a.dp.handshake(b.id.ClusterID(), at)
	s = inPhase(t, a, b, PhaseConnected)
	if !s.TunnelUp.OK || !s.LastHandshake.Equal(at.Truncate(time.Second)) {
		t.Fatalf("TunnelUp %+v, last handshake %v, want %v", s.TunnelUp, s.LastHandshake, at)
	}
	clk.Add(4 * time.Minute) // past WireGuard's reject-after time
	inPhase(t, a, b, PhaseDegraded)
}

// Byte counters go to metrics, read from the tunnel when scraped.
func TestTrafficMetrics(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	a.dp.traffic(b.id.ClusterID(), 1500, 2700)
	want := fmt.Sprintf(`
# HELP flotilla_peer_receive_bytes_total Bytes received through the tunnel from the peer (restarts at zero when its tunnel peer is recreated).
# TYPE flotilla_peer_receive_bytes_total counter
flotilla_peer_receive_bytes_total{peer=%[1]q} 1500
# HELP flotilla_peer_transmit_bytes_total Bytes sent through the tunnel to the peer (restarts at zero when its tunnel peer is recreated).
# TYPE flotilla_peer_transmit_bytes_total counter
flotilla_peer_transmit_bytes_total{peer=%[1]q} 2700
`, b.id.ClusterID())
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "flotilla_peer_receive_bytes_total", "flotilla_peer_transmit_bytes_total"); err != nil {
		t.Fatal(err)
	}
}
