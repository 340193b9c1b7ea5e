// Command demo brings up a local federation on this machine: for each
// cluster a real control plane, a real gateway node and a real worker
// node (containerd, kubelet, kube-proxy, a bridge CNI) on one shared LAN,
// all clusters on the same PodCIDR. Each cluster's agent is installed as a cluster runs
// it, with `kubectl apply --server-side -k` of deploy/ plus the cluster's
// settings, from its own image built from this checkout; a test server
// pod runs on each gateway node. The agents find each other (mDNS),
// negotiate views and bring up WireGuard tunnels, and the demo shows a
// real pod of one cluster fetching from a real pod of the other across
// the overlapping PodCIDRs: gateway node to gateway node, then worker to
// worker through the fabric. It tears everything down on Ctrl-C. `make
// demo` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

func main() {
	clusters := flag.Int("clusters", 2, "number of clusters (1-9)")
	workers := flag.Int("workers", 1, "worker nodes per cluster besides its gateway node (0-4)")
	podCIDR := flag.String("pod-cidr", "10.0.0.0/16", "PodCIDR of every cluster (the same on purpose: Flotilla remaps overlaps)")
	bin := flag.String("flotilla", "", "flotilla binary for the status command (default: build this checkout; the agent runs from its image, always built from this checkout)")
	exitWhenReady := flag.Bool("exit-when-ready", false, "tear down as soon as everything is up (for tests)")
	flag.Parse()
	if *clusters < 1 || *clusters > 9 {
		fmt.Fprintln(os.Stderr, "demo: -clusters must be 1 to 9")
		os.Exit(2)
	}
	if *workers < 0 || *workers > 4 {
		fmt.Fprintln(os.Stderr, "demo: -workers must be 0 to 4")
		os.Exit(2)
	}
	cidr, err := netip.ParsePrefix(*podCIDR)
	if err != nil || cidr != cidr.Masked() || !cidr.Addr().Is4() {
		fmt.Fprintf(os.Stderr, "demo: -pod-cidr %q: want a canonical IPv4 CIDR such as 10.0.0.0/16\n", *podCIDR)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(harness.RunProgram("demo", os.Stderr, func(p *harness.Program) {
		run(ctx, p, os.Stdout, *clusters, *workers, cidr, *bin, *exitWhenReady)
	}))
}

func run(ctx context.Context, p *harness.Program, out io.Writer, n, workers int, cidr netip.Prefix, bin string, exitWhenReady bool) {
	harness.Require(p, harness.NeedsNodes...)
	start := time.Now()
	env := harness.New(p)
	if bin == "" {
		bin = harness.Flotilla(p)
	}
	fmt.Fprintf(out, "demo: run %s: starting %d clusters of real nodes (a gateway and %d workers each), all with PodCIDR %s\n", env.RunID, n, workers, cidr)
	cs := federation.OnNodes(p, env, federation.NodeOptions{Clusters: n, PodCIDR: cidr, Workers: workers})
	fmt.Fprintf(out, "demo: control planes, gateway nodes, agents (kubectl apply -k) and test pods up in %.1fs; waiting for the agents to connect\n", time.Since(start).Seconds())
	if n > 1 {
		federation.WaitPhases(p, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	}
	fmt.Fprintf(out, "\nFederation of %d clusters connected in %.1fs (run %s, files in %s)\n", n, time.Since(start).Seconds(), env.RunID, env.Dir)
	for _, c := range cs {
		showCluster(p, out, c, bin)
	}
	var url string
	if n > 1 {
		url = showFetch(p, out, cs[0], cs[0].Web, cs[1], cs[1].Web, cidr)
		if workers > 0 {
			// Through the fabric: from a worker node to the gateway,
			// through the tunnel, and to the worker of the other.
			a, b := cs[0], cs[1]
			wa := federation.RunWeb(p, a, a.Workers[0], "web-w1")
			wb := federation.RunWeb(p, b, b.Workers[0], "web-w1")
			showFetch(p, out, a, wa, b, wb, cidr)
		}
	}
	if n > 1 {
		showOffload(p, out, cs[0], cs[1], bin)
	}
	showHowToLook(out, cs[0], url)
	fmt.Fprintf(out, "demo: ready in %.1fs\n", time.Since(start).Seconds())
	if exitWhenReady {
		fmt.Fprintln(out, "demo: everything is up; tearing down (-exit-when-ready)")
		return
	}
	fmt.Fprintln(out, "demo: press Ctrl-C to tear everything down")
	watchAgents(ctx, p, out, cs)
}

// showCluster prints where the cluster lives, its agent pod and its Peers.
func showCluster(p *harness.Program, out io.Writer, c *federation.NodeCluster, bin string) {
	fmt.Fprintf(out, "\nCluster %s: API https://%s, gateway node %s at %s (netns %s), pod %s %s on it\n",
		c.Name, c.CP.Addr, c.Gateway.NodeName, c.Gateway.Addr, c.Gateway.Name, c.Web.Name, c.Web.Status.PodIP)
	pods, err := federation.Kubectl(c.CP, "get", "pods", "-n", federation.AgentNamespace, "-o", "wide")
	if err != nil {
		p.Fatalf("agent pod of %s: %v", c.Name, err)
	}
	fmt.Fprintf(out, "$ kubectl get pods -n %s -o wide\n%s", federation.AgentNamespace, pods)
	status, err := exec.Command(bin, "status", "--kubeconfig", c.CP.Kubeconfig).CombinedOutput()
	if err != nil {
		p.Fatalf("flotilla status of %s: %v\n%s", c.Name, err, status)
	}
	fmt.Fprintf(out, "$ flotilla status\n%s", status)
}

// showFetch has a's test server pod fetch from b's by a's view of it, and
// returns the URL it fetched.
func showFetch(p *harness.Program, out io.Writer, a *federation.NodeCluster, pa corev1.Pod, b *federation.NodeCluster, pb corev1.Pod, cidr netip.Prefix) string {
	r := federation.FetchPods(p, a, pa, b, pb)
	url := fmt.Sprintf("http://%s:%d/peer", r.Dst, harness.TestServerHTTPPort)
	fmt.Fprintf(out, "\nPod-to-pod across the overlap: pod %s (%s, node %s) of %s fetched %s from pod %s (%s, node %s) of %s, at %s's view of %s;\n",
		pa.Name, pa.Status.PodIP, pa.Spec.NodeName, a.Name, url, pb.Name, pb.Status.PodIP, pb.Spec.NodeName, b.Name, a.Name, b.Name)
	if r.Err != nil {
		p.Fatalf("the fetch failed: %v", r.Err)
	}
	same := fmt.Sprintf("Both pods are in %s in their own clusters.", cidr)
	if pa.Status.PodIP == pb.Status.PodIP {
		same = fmt.Sprintf("Both pods are %s in their own clusters.", pa.Status.PodIP)
	}
	fmt.Fprintf(out, "%s's pod answered and saw the caller as %s (%s's view of %s). %s\n", b.Name, r.Seen, b.Name, a.Name, same)
	return url
}

// showOffload has b grant a, a offload a namespace to b with its pods
// Remote, and a Deployment there run on b: it prints where each pod runs
// as both clusters see it, and a request from a's test server pod
// answered by an offloaded one.
func showOffload(p *harness.Program, out io.Writer, a, b *federation.NodeCluster, bin string) {
	start := time.Now()
	cli := func(c *federation.NodeCluster, args ...string) string {
		args = append(args, "--kubeconfig", c.CP.Kubeconfig)
		got, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			p.Fatalf("flotilla %s on %s: %v\n%s", strings.Join(args, " "), c.Name, err, got)
		}
		fmt.Fprintf(out, "$ flotilla %s   # on %s\n%s", strings.Join(args[:len(args)-2], " "), c.Name, got)
		return string(got)
	}
	fmt.Fprintf(out, "\nOffloading: %s lends itself to %s, which runs a Deployment there.\n", b.Name, a.Name)
	cli(b, "grant", a.Name)
	// a's admin accepts offloading to b and labels its Peer, which the
	// namespace's selector picks.
	peers, err := a.Peers(context.Background())
	if err != nil || peers[b.Name].Name == "" {
		p.Fatalf("%s's Peer for %s: %v", a.Name, b.Name, err)
	}
	admin := func(args ...string) {
		got, err := federation.Kubectl(a.CP, args...)
		if err != nil {
			p.Fatalf("kubectl %s on %s: %v\n%s", strings.Join(args, " "), a.Name, err, got)
		}
		fmt.Fprintf(out, "$ kubectl %s   # on %s\n%s", strings.Join(args, " "), a.Name, got)
	}
	admin("patch", "peer", peers[b.Name].Name, "--type=merge", "-p", `{"spec":{"offloadTo":"Accept"}}`)
	admin("label", "peer", peers[b.Name].Name, "role=provider")
	federation.WaitOffloadCredential(p, a, b.Name, 60*time.Second)
	if _, err := federation.Kubectl(a.CP, "create", "namespace", demoNamespace); err != nil {
		p.Fatalf("create namespace %s on %s: %v", demoNamespace, a.Name, err)
	}
	cli(a, "offload", "namespace", demoNamespace, "--selector", "role=provider", "--pods", "Remote")
	federation.CreateDeployment(p, a, demoNamespace, "web", 3, nil)
	pods := federation.WaitDeployment(p, a, demoNamespace, "web", 3, 90*time.Second)
	fmt.Fprintf(out, "Deployment %s/web of %s Running in %.1fs:\n", demoNamespace, a.Name, time.Since(start).Seconds())
	show := func(c *federation.NodeCluster, args ...string) {
		got, err := federation.Kubectl(c.CP, args...)
		if err != nil {
			p.Fatalf("kubectl %s on %s: %v", strings.Join(args, " "), c.Name, err)
		}
		fmt.Fprintf(out, "$ kubectl %s   # on %s\n%s", strings.Join(args, " "), c.Name, got)
	}
	show(a, "get", "nodes")
	show(a, "-n", demoNamespace, "get", "pods", "-o", "wide")
	show(b, "get", "pods", "-A", "-l", "app=web", "-o", "wide")
	url := fmt.Sprintf("http://%s:%d/hostname", pods[0].Status.PodIP, harness.TestServerHTTPPort)
	got, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", url)
	if err != nil {
		p.Fatalf("GET %s from %s's pod %s: %v", url, a.Name, a.Web.Name, err)
	}
	fmt.Fprintf(out, "%s's local pod %s fetched %s: answered by %s, running on %s as pod %s of %s.\n",
		a.Name, a.Web.Name, url, strings.TrimSpace(got), b.Name, pods[0].Name, a.Name)
}

// demoNamespace is the namespace the demo offloads.
const demoNamespace = "shop"

// showHowToLook prints commands that look inside cluster c; url, when
// set, is what its pod fetched from another cluster.
func showHowToLook(out io.Writer, c *federation.NodeCluster, url string) {
	in := "nsenter --net=" + c.Gateway.Path
	fmt.Fprintf(out, "\nTry, for cluster %s (its gateway node's network namespace is %s):\n", c.Name, c.Gateway.Path)
	fmt.Fprintf(out, "  export KUBECONFIG=%s PATH=%s:$PATH\n", c.CP.Kubeconfig, harness.KubeBinDir())
	fmt.Fprintf(out, "  kubectl get peers -o wide\n")
	fmt.Fprintf(out, "  kubectl -n %s logs deployment/flotilla-agent\n", federation.AgentNamespace)
	if url != "" {
		fmt.Fprintf(out, "  kubectl exec %s -- /testserver -get %s\n", c.Web.Name, url)
	}
	fmt.Fprintf(out, "  %s wg show %s\n", in, c.Interface())
	fmt.Fprintf(out, "  %s nft list table ip flotilla\n", in)
	fmt.Fprintf(out, "  %s curl -s http://127.0.0.1:9470/metrics | grep ^flotilla_\n\n", in)
}

// watchAgents returns on ctx's end, and fails p when an agent pod has not
// been Ready for 10 s (or restarted).
func watchAgents(ctx context.Context, p *harness.Program, out io.Writer, cs []*federation.NodeCluster) {
	since := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "demo: tearing down")
			return
		case <-time.After(2 * time.Second):
		}
		for _, c := range cs {
			_, err := c.AgentPod(ctx)
			if err == nil || ctx.Err() != nil {
				delete(since, c.Name)
				continue
			}
			if _, ok := since[c.Name]; !ok {
				since[c.Name] = time.Now()
			}
			if time.Since(since[c.Name]) > 10*time.Second {
				p.Fatalf("agent of cluster %s: %v (kubectl --kubeconfig %s -n %s logs deployment/flotilla-agent)",
					c.Name, err, c.CP.Kubeconfig, federation.AgentNamespace)
			}
		}
	}
}
