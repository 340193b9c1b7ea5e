package peering

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// viewOf returns a's view of n's pods, as a's data path has it.
func viewOf(a, n *node) (netip.Prefix, error) {
	p, ok := a.dp.peer(n.id.ClusterID())
	if !ok || len(p.Views) != 1 {
		return netip.Prefix{}, fmt.Errorf("a has no view of %s", n.id.ClusterID()[:6])
	}
	return p.Views[0].As, nil
}

// pairedWith starts a (with opts) and a cluster named name, connects
// them, and returns both and a's view of the other's pods.
func pairedWith(t *testing.T, name string, net *network, opts nodeOptions) (a, b *node, view netip.Prefix) {
	t.Helper()
	a = newNode(t, net, opts)
	b = newNode(t, net, nodeOptions{name: name})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	view, err := viewOf(a, b)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, view
}

// A cluster back under a new identity, with its name, from its endpoint,
// takes the views its old identity had, whether the old one was declared
// dead before the new one spoke or after; another cluster of that name at
// another endpoint gets views of its own.
func TestNewIdentitySucceedsTheOldOne(t *testing.T) {
	for _, tc := range []struct {
		name string
		// deadFirst: the old identity is declared dead before the new
		// one speaks (else after, while the new one waits).
		deadFirst bool
		endpoint  netip.AddrPort
		succeeds  bool
	}{
		{"old declared dead first", true, netip.AddrPort{}, true},
		{"old declared dead after", false, netip.AddrPort{}, true},
		{"another endpoint", true, netip.MustParseAddrPort("198.18.9.9:51820"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := &network{}
			a, b, old := pairedWith(t, "b", net, nodeOptions{})
			b.stop()
			if tc.deadFirst {
				a.eng.MemberChanged(b.member(false))
			}
			b2 := newNode(t, net, nodeOptions{name: "b", endpoint: tc.endpoint})
			meet(a, b2)
			if !tc.deadFirst {
				within(t, "the new b waiting for the old one", func() error {
					if got := stateOf(a, b2).ViewsAgreed.Reason; got != "WaitingForOldIdentity" {
						return fmt.Errorf("ViewsAgreed %s", got)
					}
					return nil
				})
				if _, err := viewOf(a, b2); err == nil {
					t.Fatal("the new b has views while it waits")
				}
				a.eng.MemberChanged(b.member(false))
			}
			within(t, "the new b connected", func() error { return connected(a, b2) })
			now, err := viewOf(a, b2)
			if err != nil {
				t.Fatal(err)
			}
			if tc.succeeds && now != old {
				t.Errorf("a sees the new b at %s, the old one at %s", now, old)
			}
			if !tc.succeeds && now.Overlaps(old) {
				t.Errorf("a cluster of b's name at another endpoint got the old b's %s", now)
			}
			want := 0.0
			if tc.succeeds {
				want = 1
			}
			if got := testutil.ToFloat64(a.eng.metrics.successions); got != want {
				t.Errorf("flotilla_peering_successions_total = %v, want %v", got, want)
			}
			for _, q := range a.ledger.Quarantine() {
				if q.Peer == b.id.ClusterID() {
					t.Errorf("the old b keeps %s in quarantine after its successor connected", q.Block)
				}
			}
		})
	}
}

// An old identity that stays alive past the wait keeps its views, and the
// new one gets views of its own: an alive cluster never loses its
// addresses to one that claims its name.
func TestAliveIdentityKeepsItsViews(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a, b, old := pairedWith(t, "b", net, nodeOptions{clock: clk})
	b2 := newNode(t, net, nodeOptions{name: "b"})
	meet(a, b2)
	within(t, "the new b waiting", func() error {
		if got := stateOf(a, b2).ViewsAgreed.Reason; got != "WaitingForOldIdentity" {
			return fmt.Errorf("ViewsAgreed %s", got)
		}
		return nil
	})
	clk.Add(successionWait)
	within(t, "the new b connected", func() error { return errors.Join(connected(a, b2), connected(a, b)) })
	if now, err := viewOf(a, b); err != nil || now != old {
		t.Fatalf("the old b, alive, seen at %s (%v); was %s", now, err, old)
	}
	if now, _ := viewOf(a, b2); now.Overlaps(old) {
		t.Fatalf("the new b got the alive old b's %s", now)
	}
}
