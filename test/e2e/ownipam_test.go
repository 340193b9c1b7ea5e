package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A cluster on 10.0.0.0/8 whose nodes have no spec.podCIDRs (its
// controller manager allocates none; the node's CNI range is given to
// the CNI directly, as a CNI with its own IPAM does) peers with one on
// 10.244.0.0/16, inside the /8. a's agent learns the block its pods live
// in from their addresses and announces that, not the /8, so b can map
// it and the pods talk both ways. A node joining a later, with a pod in a
// new block, has that block announced and reached.
func TestPodBlocksFromPodAddresses(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cniRange := func(node int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 3, byte(7 + node), 0}), 24)
	}
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2,
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.244.0.0/16")},
		NodeCIDRsOf: func(cluster, node int) netip.Prefix {
			if cluster == 0 {
				return cniRange(node)
			}
			return netip.Prefix{}
		},
	})
	a, b := cs[0], cs[1]
	t.Cleanup(func() {
		if t.Failed() {
			agentErrors(t, env, cs)
		}
	})
	nodes, err := a.CP.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if len(n.Spec.PodCIDRs) > 0 {
			t.Fatalf("a's Node %s has spec.podCIDRs %v: the test needs none", n.Name, n.Spec.PodCIDRs)
		}
	}
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)

	if !cniRange(0).Contains(netip.MustParseAddr(a.Web.Status.PodIP)) {
		t.Fatalf("a's pod %s at %s, outside its node's CNI range %s", a.Web.Name, a.Web.Status.PodIP, cniRange(0))
	}
	if got, want := theirRanges(t, b, a), []string{cniRange(0).String()}; !slices.Equal(got, want) {
		t.Errorf("b sees a's networks %v, want the block of a's pods %v", got, want)
	}
	talk := func(t *testing.T, pod corev1.Pod) {
		t.Helper()
		for _, r := range []federation.Result{federation.FetchPods(t, a, pod, b, b.Web), federation.FetchPods(t, b, b.Web, a, pod)} {
			if r.Err != nil {
				t.Errorf("%s -> %s (%s): %v", r.From.Name, r.To.Name, r.Dst, r.Err)
			}
		}
	}
	t.Run("pods talk", func(t *testing.T) { talk(t, a.Web) })
	t.Run("a pod in a new block", func(t *testing.T) {
		w := a.AddWorkers(t, "w1")[0]
		pod := federation.RunWeb(t, a, w, "web-w1")
		running := time.Now()
		eventually.Within(t, 60*time.Second, "b views a's new block "+cniRange(1).String(), func() error {
			if got := theirRanges(t, b, a); !slices.Equal(got, []string{cniRange(0).String(), cniRange(1).String()}) {
				return fmt.Errorf("b sees a's %v", got)
			}
			return nil
		})
		t.Logf("pod %s at %s Ready; its block viewed by b %s after", pod.Name, pod.Status.PodIP, time.Since(running).Round(time.Millisecond))
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 60*time.Second)
		talk(t, pod)
		talk(t, a.Web)
	})
}
