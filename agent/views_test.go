package agent

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// viewsOf returns how cluster c addresses each of o's ranges, from c's
// Peer of o.
func viewsOf(c, o *federation.Cluster) (map[netip.Prefix]netip.Prefix, error) {
	peers, err := c.Peers(context.Background())
	if err != nil {
		return nil, err
	}
	p, ok := peers[o.Name]
	if !ok {
		return nil, fmt.Errorf("%s has no Peer for %s", c.Name, o.Name)
	}
	out := map[netip.Prefix]netip.Prefix{}
	for _, v := range p.Status.TheirNetworks {
		out[netip.MustParsePrefix(v.Range)] = netip.MustParsePrefix(v.As)
	}
	return out, nil
}

// A peer's range inside the gateway's LAN is not routed into the tunnel:
// the node's connected networks, the cluster's Node addresses and the
// ranges reserved by flag are local networks, and a view that overlaps one
// is moved out of it, also when a Node appears while the agent runs. Pods
// keep talking through the views.
func TestViewsAvoidTheNodeNetwork(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	var (
		nodeLAN  = netip.MustParsePrefix("192.168.0.0/16")
		inLAN    = netip.MustParsePrefix("192.168.2.0/24") // b's pods
		reserved = netip.MustParsePrefix("172.30.0.0/16")
		inRsv    = netip.MustParsePrefix("172.30.1.0/24")
		later    = netip.MustParsePrefix("172.31.0.0/24")
		nodeIP   = netip.MustParseAddr("172.31.0.9")
	)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{
		PodCIDRs: []string{"10.244.0.0/16", inLAN.String()},
		ArgsFor: func(i int, _ []*federation.Cluster) []string {
			if i == 0 {
				return []string{"--reserved-cidr", reserved.String()}
			}
			return []string{"--pod-cidr", inRsv.String() + "," + later.String()}
		},
	})
	a, b := cs[0], cs[1]
	// a's gateway also sits on a 192.168.0.0/16 LAN, as many do.
	addLink(t, a.Site, "lan1", true, "192.168.0.1/16")
	federation.Connect(t, cs)

	views, err := viewsOf(a, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		theirs, local netip.Prefix
		what          string
	}{{inLAN, nodeLAN, "the node's network"}, {inRsv, reserved, "the reserved range"}} {
		if v, ok := views[c.theirs]; !ok || v.Overlaps(c.local) {
			t.Errorf("a sees b's %s as %s (found: %v), inside %s %s", c.theirs, v, ok, c.what, c.local)
		}
	}
	if v := views[later]; v != later {
		t.Errorf("a sees b's %s as %s; want itself, nothing here uses it yet", later, v)
	}
	routes := a.Site.MustExec("ip", "route", "show", "proto", "102")
	if v := views[inLAN]; !strings.Contains(routes, v.String()) || strings.Contains(routes, inLAN.String()) {
		t.Errorf("a's routes into the tunnel should hold the view %s, not %s:\n%s", v, inLAN, routes)
	}
	federation.AllPairsTalk(t, cs)

	// A Node joins a's cluster with an address in b's range.
	ctx := context.Background()
	nodes := a.CP.Client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nodes.Delete(context.Background(), "late", metav1.DeleteOptions{}) })
	// The controller manager may be writing the new Node meanwhile.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, "late", metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}}
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var moved netip.Prefix
	waitUntil(t, "a moves its view of b's "+later.String()+" off the new Node's address", func() error {
		views, err := viewsOf(a, b)
		if err != nil {
			return err
		}
		if moved = views[later]; !moved.IsValid() || moved.Contains(nodeIP) {
			return fmt.Errorf("view %s", moved)
		}
		return nil
	})
	waitUntil(t, "a routes the moved view", func() error {
		if routes := a.Site.MustExec("ip", "route", "show", "proto", "102"); !strings.Contains(routes, moved.String()+" ") {
			return fmt.Errorf("no route to %s:\n%s", moved, routes)
		}
		return nil
	})
	federation.AllPairsTalk(t, cs)
}
