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
