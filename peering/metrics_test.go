package peering

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// phaseSeries is what flotilla_peer_phase says in n's registry: for each
// peer, its cluster name and the phase at 1, and how many series there
// are.
func phaseSeries(t *testing.T, n *node) (map[string]string, int) {
	t.Helper()
	families, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out, series := map[string]string{}, 0
	for _, f := range families {
		if f.GetName() != "flotilla_peer_phase" {
			continue
		}
		for _, m := range f.GetMetric() {
			series++
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if m.GetGauge().GetValue() == 1 {
				out[labels["peer"]] = labels["peer_name"] + " " + labels["phase"]
			}
		}
	}
	return out, series
}

// flotilla_peer_phase names the peer that is down: one series per peer
// and phase, 1 for the phase it is in, gone once the peer is forgotten.
func TestPeerPhaseMetric(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a, b := newNode(t, net, nodeOptions{clock: clk}), newNode(t, net, nodeOptions{})
	meet(a, b)
	id := b.id.ClusterID()
	want := func(what, phase string) {
		t.Helper()
		within(t, what, func() error {
			got, series := phaseSeries(t, a)
			if w := "cluster-" + id[:6] + " " + phase; got[id] != w || len(got) != 1 || series != len(Phases) {
				return fmt.Errorf("flotilla_peer_phase at 1: %v in %d series, want %s: %s in %d", got, series, id, w, len(Phases))
			}
			if names := a.eng.PeerNames(); len(names) != 1 || names[id] != "cluster-"+id[:6] {
				return fmt.Errorf("PeerNames %v, want %s: cluster-%s", names, id, id[:6])
			}
			return nil
		})
	}
	within(t, "tunnel configured", func() error { return connected(a, b) })
	a.dp.handshake(id, clk.Now())
	want("b connected", "Connected")
	a.eng.MemberChanged(b.member(false))
	want("b unreachable", "Unreachable")
	clk.Add(2 * time.Minute)
	within(t, "b's series gone once it is forgotten", func() error {
		if got, series := phaseSeries(t, a); series != 0 {
			return errors.New(fmt.Sprint(got, series, " series"))
		}
		if names := a.eng.PeerNames(); len(names) != 0 {
			return fmt.Errorf("PeerNames %v once b is forgotten", names)
		}
		return nil
	})
}
