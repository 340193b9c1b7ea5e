package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Every node in the federation, on clusters whose CNI is a real flannel:
// two clusters of three real nodes (a gateway and two workers), both on
// 10.0.0.0/16, each node running flanneld (Kubernetes subnet manager,
// VXLAN between the nodes, flannel's own masquerade with iptables-nft)
// before the agent is installed. Pods on the workers of each cluster talk
// to pods on the workers of the other, in both directions, each seeing
// the other at its own view of it; then with Calico's rules (nft) added
// after the agent. The gateway's and a worker's hosts reach remote pods
// too. A worker added after peering gets its routes, and the gateway
// drops its route when it leaves; a fabric pod restarted keeps traffic
// flowing; an uninstall leaves no rule, route or table of the fabric on
// any node (and leaves flannel's own alone).
func TestFabric(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	harness.Require(t, harness.IPTables, harness.Flannel)
	var run string
	t.Run("federation", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		start := time.Now()
		cs := federation.OnNodes(t, env, federation.NodeOptions{
			Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
			Workers: 2, Flannel: true,
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
		t.Run("the clusters are what OnNodes says", func(t *testing.T) { checkOnNodes(t, cs) })
		web := map[*federation.NodeCluster]corev1.Pod{}
		for _, c := range cs {
			web[c] = federation.RunWeb(t, c, c.Workers[0], "web-w1")
		}
		talk := func(t *testing.T) {
			t.Helper()
			for _, from := range cs {
				for _, to := range cs {
					if from == to {
						continue
					}
					if r := federation.FetchPods(t, from, web[from], to, web[to]); r.Err != nil {
						t.Errorf("worker pod of %s -> worker pod of %s (%s): %v\n%s", from.Name, to.Name, r.Dst, r.Err, fabricDiagnosis(cs))
					}
				}
			}
		}

		t.Run("worker pods talk by their views, flannel's masquerade first", talk)
		t.Run("flotilla trace follows a worker pod to a remote one", func(t *testing.T) { traceWorkerPod(t, cs, web) })
		t.Run("the fabric is on every node", func(t *testing.T) {
			for _, c := range cs {
				for _, n := range append([]*harness.Node{c.Gateway}, c.Workers...) {
					if left := fabricOn(n); len(left) == 0 {
						t.Errorf("node %s of %s holds nothing of the fabric", n.NodeName, c.Name)
					}
				}
			}
		})
		t.Run("with Calico's masquerade (nft) added after the agent", func(t *testing.T) {
			for _, c := range cs {
				for _, n := range append([]*harness.Node{c.Gateway}, c.Workers...) {
					if err := n.InstallMasquerade(harness.CalicoNFT); err != nil {
						t.Fatal(err)
					}
				}
			}
			talk(t)
		})
		t.Run("the gateway and worker hosts reach a remote worker pod", func(t *testing.T) {
			for _, from := range cs {
				for _, to := range cs {
					if from == to {
						continue
					}
					dst := federation.ViewOf(t, from.Cluster, to.Cluster, netip.MustParseAddr(web[to].Status.PodIP))
					// A host's source (its own traffic, a hostNetwork
					// pod's): the first address of its node's pod block,
					// as the peer sees it.
					for _, host := range []*harness.Node{from.Gateway, from.Workers[0]} {
						want := federation.ViewOf(t, to.Cluster, from.Cluster, host.PodCIDR.Addr().Next())
						if err := host.Ping(dst); err != nil {
							t.Errorf("host %s of %s pings %s's worker pod at %s: %v", host.NodeName, from.Name, to.Name, dst, err)
						}
						// Both clusters' pods are web-w1 at the same
						// address: the UID says which one answered.
						answer, err := host.TCPAnswer(netip.AddrPortFrom(dst, harness.TestServerTCPPort))
						if err == nil {
							err = federation.AnsweredBy(answer, to.Name, web[to])
						}
						switch {
						case err != nil:
							t.Errorf("host %s of %s -> %s's worker pod at %s: %v", host.NodeName, from.Name, to.Name, dst, err)
						case answer.Seen != want:
							t.Errorf("host %s of %s -> %s's worker pod at %s: seen as %s, want %s", host.NodeName, from.Name, to.Name, dst, answer.Seen, want)
						}
					}
				}
			}
		})
		t.Run("1 MB crosses with ICMP fragmentation-needed dropped", func(t *testing.T) {
			// Every node drops ICMP "fragmentation needed", as firewalls on
			// many paths do: path MTU discovery cannot work, only the MSS
			// clamp keeps segments within the tunnel's MTU.
			for _, c := range cs {
				for _, n := range append([]*harness.Node{c.Gateway}, c.Workers...) {
					dropFragNeeded(t, n)
				}
			}
			for _, from := range cs {
				for _, to := range cs {
					if from == to {
						continue
					}
					dst := federation.ViewOf(t, from.Cluster, to.Cluster, netip.MustParseAddr(web[to].Status.PodIP))
					url := fmt.Sprintf("http://%s:%d/bytes?n=%d", dst, harness.TestServerHTTPPort, 1<<20)
					out, err := federation.KubectlTimeout(from.CP, time.Minute, "exec", web[from].Name, "--", "/testserver", "-discard", "-get", url)
					if err != nil || !strings.HasPrefix(out, fmt.Sprint(1<<20)+" ") {
						t.Errorf("%s's worker pod GET 1 MB from %s's at %s: %q, %v", from.Name, to.Name, dst, out, err)
					}
				}
			}
		})
		t.Run("a worker added after peering gets its routes", func(t *testing.T) {
			a, b := cs[0], cs[1]
			n := a.AddWorkers(t, "w3")[0]
			pod := federation.RunWeb(t, a, n, "web-w3")
			if r := federation.FetchPods(t, a, pod, b, web[b]); r.Err != nil {
				t.Errorf("pod on the new worker -> %s: %v\n%s", b.Name, r.Err, fabricDiagnosis(cs))
			}
			if r := federation.FetchPods(t, b, web[b], a, pod); r.Err != nil {
				t.Errorf("%s -> pod on the new worker: %v\n%s", b.Name, r.Err, fabricDiagnosis(cs))
			}
		})
		t.Run("a worker that leaves loses its route on the gateway", func(t *testing.T) {
			a := cs[0]
			n := a.Workers[len(a.Workers)-1]
			gatewayRoutes := func() (bool, error) {
				routes, err := a.Gateway.Netlink().RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: fabricTable}, netlink.RT_FILTER_TABLE)
				if err != nil {
					return false, err
				}
				for _, r := range routes {
					if r.Dst != nil && r.Dst.String() == n.PodCIDR.String() {
						return true, nil
					}
				}
				return false, nil
			}
			eventually.Within(t, 30*time.Second, "the gateway routes "+n.NodeName+"'s block", func() error {
				if ok, err := gatewayRoutes(); err != nil || !ok {
					return fmt.Errorf("no route to %s in table %d (%v)", n.PodCIDR, fabricTable, err)
				}
				return nil
			})
			// The node goes for good: stopped, its Node deleted (Stop does), and its
			// fabric pod, which no kubelet confirms any more, removed.
			a.Workers = a.Workers[:len(a.Workers)-1]
			if err := n.Stop(); err != nil {
				t.Fatal(err)
			}
			mustKubectl(t, a.CP, "delete", "node", "--ignore-not-found", n.NodeName)
			mustKubectl(t, a.CP, "-n", federation.AgentNamespace, "delete", "pod", "--force", "--grace-period=0",
				"--field-selector", "spec.nodeName="+n.NodeName)
			eventually.Within(t, 30*time.Second, "the gateway's route to "+n.NodeName+"'s block gone", func() error {
				if ok, err := gatewayRoutes(); err != nil || ok {
					return fmt.Errorf("route to %s still in table %d (%v)", n.PodCIDR, fabricTable, err)
				}
				return nil
			})
		})
		t.Run("a fabric pod restarted keeps traffic flowing", func(t *testing.T) {
			a, b := cs[0], cs[1]
			ctx := t.Context()
			old := fabricPod(t, a, a.Workers[0])
			if err := a.CP.Client.CoreV1().Pods(federation.AgentNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			// While no fabric pod runs on the node (its old one gone,
			// the new one not yet started), traffic still flows.
			eventually.Within(t, 30*time.Second, "the old fabric pod gone", func() error {
				_, err := a.CP.Client.CoreV1().Pods(federation.AgentNamespace).Get(ctx, old.Name, metav1.GetOptions{})
				if err == nil {
					return fmt.Errorf("pod %s still there", old.Name)
				}
				return nil
			})
			if r := federation.FetchPods(t, a, web[a], b, web[b]); r.Err != nil {
				t.Errorf("between fabric pods: %v", r.Err)
			}
			eventually.Within(t, 60*time.Second, "a new fabric pod Ready on the node", func() error {
				p, err := fabricPodOn(ctx, a, a.Workers[0])
				if err != nil {
					return err
				}
				if p.UID == old.UID {
					return fmt.Errorf("still the old pod")
				}
				return federation.PodReady(p)
			})
			talk(t)
		})
		t.Run("uninstall leaves nothing of the fabric on any node", func(t *testing.T) {
			a := cs[0]
			mustKubectl(t, a.CP, "delete", "-k", a.Install, "--wait", "--timeout=90s")
			for _, n := range append([]*harness.Node{a.Gateway}, a.Workers...) {
				eventually.Within(t, 30*time.Second, "nothing of the fabric on "+n.NodeName, func() error {
					if left := fabricOn(n); len(left) > 0 {
						return fmt.Errorf("left: %s", strings.Join(left, "; "))
					}
					return nil
				})
			}
		})
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

// checkOnNodes checks the harness's side of the clusters: every node on
// the gateways' LAN with flannel's masquerade in nat POSTROUTING, the
// workers labelled as such, and a worker's pod reaching the gateway's pod
// inside the cluster with its own address.
func checkOnNodes(t *testing.T, cs []*federation.NodeCluster) {
	ctx := t.Context()
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
			if exited, _ := n.Flannel.Exited(); exited {
				t.Errorf("node %s of %s: flanneld exited:\n%s", n.NodeName, c.Name, n.Flannel.Tail(10))
			}
			if link, err := n.Exec(ctx, "ip", "-d", "link", "show", "flannel.1"); err != nil || !strings.Contains(string(link), "vxlan") {
				t.Errorf("node %s of %s: no flannel VXLAN device flannel.1 (%v):\n%s", n.NodeName, c.Name, err, link)
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
	pod := federation.RunWeb(t, a, a.Workers[1], "web-w2")
	if !a.Workers[1].PodCIDR.Contains(netip.MustParseAddr(pod.Status.PodIP)) {
		t.Fatalf("pod %s with %s, want in %s's block %s", pod.Name, pod.Status.PodIP, a.Workers[1].NodeName, a.Workers[1].PodCIDR)
	}
	url := fmt.Sprintf("http://%s:%d/peer", a.Web.Status.PodIP, harness.TestServerHTTPPort)
	out, err := federation.Kubectl(a.CP, "exec", pod.Name, "--", "/testserver", "-get", url)
	if err != nil {
		t.Fatal(err)
	}
	if seen := strings.TrimSpace(out); seen != pod.Status.PodIP {
		t.Errorf("the gateway's pod saw the worker's pod (%s) as %s", pod.Status.PodIP, seen)
	}
}

// dropFragNeeded drops ICMP "fragmentation needed" the node sends or
// forwards, until the test ends.
func dropFragNeeded(t *testing.T, n *harness.Node) {
	t.Helper()
	const rules = `table ip flotest-pmtu {
	chain pmtu_out { type filter hook output priority 0; icmp type destination-unreachable icmp code frag-needed counter drop; }
	chain pmtu_fwd { type filter hook forward priority 0; icmp type destination-unreachable icmp code frag-needed counter drop; }
}
`
	if err := n.Do(func() error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatalf("drop ICMP fragmentation-needed on %s: %v", n.NodeName, err)
	}
	t.Cleanup(func() { n.Exec(context.Background(), "nft", "delete", "table", "ip", "flotest-pmtu") })
}

// fabricOn lists what of the fabric a node holds: rules to its table,
// routes in it, a worker's host source on lo, its nftables table.
func fabricOn(n *harness.Node) []string {
	var out []string
	if rules, err := n.Exec(context.Background(), "ip", "rule", "show", "table", fmt.Sprint(fabricTable)); err == nil && len(strings.TrimSpace(string(rules))) > 0 {
		out = append(out, "rules: "+strings.TrimSpace(string(rules)))
	}
	if routes, err := n.Exec(context.Background(), "ip", "route", "show", "table", fmt.Sprint(fabricTable)); err == nil && len(strings.TrimSpace(string(routes))) > 0 {
		out = append(out, "routes: "+strings.TrimSpace(string(routes)))
	}
	if addrs, err := n.Exec(context.Background(), "ip", "-4", "addr", "show", "dev", "lo", "label", fabricHostLabel); err == nil && len(strings.TrimSpace(string(addrs))) > 0 {
		out = append(out, "host source on lo: "+strings.TrimSpace(string(addrs)))
	}
	if _, err := n.Exec(context.Background(), "nft", "list", "table", "ip", fabricNFTable); err == nil {
		out = append(out, "nftables table ip "+fabricNFTable)
	}
	return out
}

// The fabric's defaults (package fabric).
const (
	fabricTable     = 102
	fabricNFTable   = "flotilla-fabric"
	fabricHostLabel = "lo:flotilla"
)

// fabricDiagnosis says what the fabric holds on every node, and the
// fabric pods' last log lines, for a failure message.
func fabricDiagnosis(cs []*federation.NodeCluster) string {
	var b strings.Builder
	for _, c := range cs {
		for _, n := range append([]*harness.Node{c.Gateway}, c.Workers...) {
			fmt.Fprintf(&b, "%s/%s: %s\n", c.Name, n.NodeName, strings.Join(fabricOn(n), "; "))
		}
		out, _ := federation.Kubectl(c.CP, "-n", federation.AgentNamespace, "logs", "--tail=5", "--prefix", "-l", "app.kubernetes.io/component=fabric")
		b.WriteString(out)
	}
	return b.String()
}

// fabricPod is the fabric's pod on node, once Ready.
func fabricPod(t *testing.T, c *federation.NodeCluster, node *harness.Node) corev1.Pod {
	t.Helper()
	var p corev1.Pod
	eventually.Within(t, 60*time.Second, "fabric pod Ready on "+node.NodeName, func() error {
		var err error
		if p, err = fabricPodOn(t.Context(), c, node); err != nil {
			return err
		}
		return federation.PodReady(p)
	})
	return p
}

func fabricPodOn(ctx context.Context, c *federation.NodeCluster, node *harness.Node) (corev1.Pod, error) {
	pods, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=fabric",
		FieldSelector: "spec.nodeName=" + node.NodeName,
	})
	if err != nil {
		return corev1.Pod{}, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return corev1.Pod{}, fmt.Errorf("no fabric pod on %s (of %d)", node.NodeName, len(pods.Items))
}
