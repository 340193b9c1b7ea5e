package federation_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Real nodes, with workers: two clusters of a gateway and two workers
// each, with flannel's iptables masquerade on every node, come up with
// their agents on the gateways and connect. Every worker is a Ready node
// labelled "worker" on the gateways' LAN with the masquerade installed, a
// test server pod runs on a worker (RunWeb) and reaches the gateway's pod
// with its own address. Nothing of the run is left after it.
func TestOnNodesWorkers(t *testing.T) {
	harness.Require(t, append(harness.NeedsNodes, harness.IPTables)...)
	var run string
	t.Run("federation", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		start := time.Now()
		cs := federation.OnNodes(t, env, federation.NodeOptions{
			Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
			Workers: 2, Masquerade: harness.FlannelIPTables,
		})
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
		var mem int64
		for _, c := range cs {
			mem += c.CP.Memory() + c.Gateway.Memory()
			for _, w := range c.Workers {
				mem += w.Memory()
			}
		}
		t.Logf("2 clusters of 3 nodes: Peers Connected %s after the start; %d MiB", time.Since(start).Round(time.Millisecond), mem>>20)

		ctx := context.Background()
		lan := netip.PrefixFrom(cs[0].Gateway.Addr, 24).Masked()
		for _, c := range cs {
			if len(c.Workers) != 2 {
				t.Fatalf("cluster %s has %d workers, want 2", c.Name, len(c.Workers))
			}
			for _, n := range append([]*harness.Node{c.Gateway}, c.Workers...) {
				if !lan.Contains(n.Addr) {
					t.Errorf("node %s of %s at %s, off the gateways' LAN %s", n.NodeName, c.Name, n.Addr, lan)
				}
				rules, err := n.Exec(ctx, "iptables-nft", "-t", "nat", "-S", "POSTROUTING")
				if err != nil || !strings.Contains(string(rules), "FLANNEL-POSTRTG") {
					t.Errorf("node %s of %s: no flannel masquerade in nat POSTROUTING (%v):\n%s", n.NodeName, c.Name, err, rules)
				}
			}
			for _, w := range c.Workers {
				node, err := c.CP.Client.CoreV1().Nodes().Get(ctx, w.NodeName, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if role := node.Labels[harness.RoleLabel]; role != "worker" {
					t.Errorf("node %s of %s has role %q, want worker", w.NodeName, c.Name, role)
				}
			}
		}

		a := cs[0]
		pod := federation.RunWeb(t, a, a.Workers[0], "web-w1")
		if pod.Spec.NodeName != a.Workers[0].NodeName || !a.Workers[0].PodCIDR.Contains(netip.MustParseAddr(pod.Status.PodIP)) {
			t.Fatalf("pod %s on %s with %s, want on %s in %s", pod.Name, pod.Spec.NodeName, pod.Status.PodIP, a.Workers[0].NodeName, a.Workers[0].PodCIDR)
		}
		url := fmt.Sprintf("http://%s:%d/peer", a.Web.Status.PodIP, harness.TestServerHTTPPort)
		out, err := federation.Kubectl(a.CP, "exec", pod.Name, "--", "/testserver", "-get", url)
		if err != nil {
			t.Fatal(err)
		}
		if seen := strings.TrimSpace(out); seen != pod.Status.PodIP {
			t.Errorf("the gateway's pod saw the worker's pod (%s) as %s", pod.Status.PodIP, seen)
		}
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}
