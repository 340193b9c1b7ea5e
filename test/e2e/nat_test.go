package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Clusters b and c each sit behind a masquerading router that lets
// nothing in (--behind-nat); cluster a is on the LAN. b and c join a by
// its seed. a peers with both: the Peers connect, pods talk both ways by
// their views, a's pod reaching b's and c's through the tunnels they
// opened, and a sees each at its router's address. b and c, both behind
// NAT, cannot peer: each one's Peer of the other says so.
func TestPeeringBehindNAT(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{
		PodCIDRs: sameCIDR3, BehindNAT: []int{1, 2}, Args: []string{"--mdns=false"},
		ArgsFor: func(i int, cs []*federation.Cluster) []string {
			if i == 0 {
				return nil
			}
			return []string{"--join", cs[0].Site.Addr.String() + ":7946", "--behind-nat"}
		},
	})
	a, b, c := cs[0], cs[1], cs[2]
	for _, cl := range cs {
		cl.StartAgent(t)
	}
	federation.WaitPhases(t, []*federation.Cluster{a, b}, v1alpha1.PhaseConnected, 90*time.Second)
	federation.WaitPhases(t, []*federation.Cluster{a, c}, v1alpha1.PhaseConnected, 90*time.Second)
	federation.AllPairsTalk(t, []*federation.Cluster{a, b})
	federation.AllPairsTalk(t, []*federation.Cluster{a, c})

	ctx := context.Background()
	peersOfA, err := a.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, behind := range []*federation.Cluster{b, c} {
		p := peersOfA[behind.Name]
		ep, err := netip.ParseAddrPort(p.Status.Endpoint)
		if err != nil || ep.Addr() != behind.NAT.Addr {
			t.Errorf("a's Peer of %s: endpoint %q, want its router's address %s (learned from its handshakes)", behind.Name, p.Status.Endpoint, behind.NAT.Addr)
		}
		checkCondition(t, "a's Peer of "+behind.Name, p, v1alpha1.ConditionReachable, true, "PeerBehindNAT")
	}
	peersOfB, err := b.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkCondition(t, "b's Peer of a", peersOfB[a.Name], v1alpha1.ConditionReachable, true, "BehindNAT")

	// b and c are members of each other's (a relays their probes) and
	// know they cannot peer.
	eventually.Within(t, 30*time.Second, "b and c say they are both behind NAT", func() error {
		for _, pair := range [][2]*federation.Cluster{{b, c}, {c, b}} {
			// Unnamed: the name comes with a statement, which never
			// arrives. The Peer shows the member's gossip address.
			var list v1alpha1.PeerList
			if err := pair[0].Client.List(ctx, &list); err != nil {
				return err
			}
			gossip := netip.AddrPortFrom(pair[1].Site.Addr, 7946).String()
			i := slices.IndexFunc(list.Items, func(p v1alpha1.Peer) bool { return p.Status.Gossip == gossip })
			if i < 0 {
				return fmt.Errorf("%s has no Peer for %s (gossip %s)", pair[0].Name, pair[1].Name, gossip)
			}
			p := list.Items[i]
			r := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReachable)
			if p.Status.Phase != v1alpha1.PhaseUnreachable || r == nil || r.Reason != "BothBehindNAT" || r.Status != "False" {
				return fmt.Errorf("%s sees %s %s, Reachable %+v", pair[0].Name, pair[1].Name, p.Status.Phase, r)
			}
		}
		return nil
	})

	// Past memberlist's suspicion timeouts and a push/pull: a, which
	// cannot dial b or c, still has them as live members, Connected.
	time.Sleep(20 * time.Second)
	federation.WaitPhases(t, []*federation.Cluster{a, b}, v1alpha1.PhaseConnected, 10*time.Second)
	federation.WaitPhases(t, []*federation.Cluster{a, c}, v1alpha1.PhaseConnected, 10*time.Second)
	federation.AllPairsTalk(t, []*federation.Cluster{a, b})
}

func checkCondition(t *testing.T, what string, p v1alpha1.Peer, kind string, ok bool, reason string) {
	t.Helper()
	c := meta.FindStatusCondition(p.Status.Conditions, kind)
	want := "False"
	if ok {
		want = "True"
	}
	if c == nil || string(c.Status) != want || c.Reason != reason {
		t.Errorf("%s: condition %s is %+v, want %s %s", what, kind, c, want, reason)
	}
}

// Cluster a's nodes sit on a LAN behind a masquerading router that lets
// nothing in and maps every flow to a port of its choosing; a's agent runs
// with --behind-nat and joins b, whose gateway is on the shared LAN. Before
// anything is asserted of the peering, b is shown to have no way in: the
// router reaches a's gossip port, b does not, neither at the router's
// address nor at a's own (with a route to a's LAN via the router). Then
// the Peers connect, pods on the gateway nodes talk both ways by their
// views, and b's Peer of a shows the endpoint b learnt from a's
// handshakes: the router's address and the port it mapped a's WireGuard
// flow to. Nothing of the run is left.
func TestPeeringBehindNATOnNodes(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	var run string
	t.Run("federation", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		cs := federation.OnNodes(t, env, federation.NodeOptions{
			Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), BehindNAT: []int{0}, Later: []int{0},
		})
		a, b := cs[0], cs[1]
		ctx := t.Context()
		gossip := netip.AddrPortFrom(a.Gateway.Addr, 7946)
		a.InstallAgent(t, []string{"--behind-nat", "--join=" + netip.AddrPortFrom(b.Gateway.Addr, 7946).String()})

		t.Run("nothing gets in to a", func(t *testing.T) {
			// The positive witness first: a's agent answers at its gossip
			// port from the router, so a refusal from b is the router's.
			eventually.Within(t, 10*time.Second, "the router reaches a's gossip port", func() error {
				c, err := a.NAT.DialContext(ctx, "tcp", gossip.String())
				if err != nil {
					return err
				}
				return c.Close()
			})
			lanOfA := netip.PrefixFrom(a.Gateway.Addr, 24).Masked().String()
			if out, err := b.Gateway.Exec(ctx, "ip", "route", "add", lanOfA, "via", a.NAT.Addr.String()); err != nil {
				t.Fatalf("route a's LAN via the router on b's gateway node: %v: %s", err, out)
			}
			defer b.Gateway.Exec(context.Background(), "ip", "route", "del", lanOfA)
			for _, to := range []netip.AddrPort{gossip, netip.AddrPortFrom(a.NAT.Addr, 7946)} {
				if err := dialFrom(ctx, b.Gateway, to); err == nil {
					t.Errorf("b's gateway node reached %s: the router lets connections in, so the test proves nothing", to)
				}
			}
		})
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 120*time.Second)

		t.Run("pods on the gateway nodes talk both ways", func(t *testing.T) {
			for _, pair := range [][2]*federation.NodeCluster{{a, b}, {b, a}} {
				if r := federation.Fetch(t, pair[0], pair[1]); r.Err != nil {
					t.Errorf("%s -> %s (%s): %v", pair[0].Name, pair[1].Name, r.Dst, r.Err)
				}
			}
		})
		t.Run("b learnt a's endpoint from its handshakes", func(t *testing.T) {
			mapped, err := a.NAT.Mappings(ctx, "udp", netip.AddrPortFrom(a.Gateway.Addr, 51820))
			if err != nil {
				t.Fatal(err)
			}
			if len(mapped) != 1 || mapped[0].Addr() != a.NAT.Addr {
				t.Fatalf("the router maps a's WireGuard port to %v, want one port of %s", mapped, a.NAT.Addr)
			}
			peersOfB, err := b.Peers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p := peersOfB[a.Name]
			t.Logf("b's Peer of a at %s; the router maps a's WireGuard port to %s", p.Status.Endpoint, mapped[0])
			if p.Status.Endpoint != mapped[0].String() {
				t.Errorf("b's Peer of a: endpoint %q, want %s, the router's mapping of a's WireGuard flow", p.Status.Endpoint, mapped[0])
			}
			checkCondition(t, "b's Peer of a", p, v1alpha1.ConditionReachable, true, "PeerBehindNAT")
			peersOfA, err := a.Peers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkCondition(t, "a's Peer of b", peersOfA[b.Name], v1alpha1.ConditionReachable, true, "BehindNAT")
		})
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}
