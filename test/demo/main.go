// Command demo brings up a local federation on this machine: for each
// cluster a real control plane, a gateway site on one LAN, a pod behind
// it and a flotilla agent, all clusters on the same PodCIDR. The agents
// find each other (mDNS), negotiate views, bring up WireGuard tunnels, and
// the demo shows a pod-to-pod exchange across the overlapping PodCIDRs.
// It tears everything down on Ctrl-C. `make demo` runs it.
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
	"path/filepath"
	"syscall"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

func main() {
	clusters := flag.Int("clusters", 2, "number of clusters (1-9)")
	podCIDR := flag.String("pod-cidr", "10.0.0.0/16", "PodCIDR of every cluster (the same on purpose: Flotilla remaps overlaps)")
	bin := flag.String("flotilla", "", "flotilla binary (default: build this checkout)")
	exitWhenReady := flag.Bool("exit-when-ready", false, "tear down as soon as everything is up (for tests)")
	flag.Parse()
	if *clusters < 1 || *clusters > 9 {
		fmt.Fprintln(os.Stderr, "demo: -clusters must be 1 to 9")
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
		run(ctx, p, os.Stdout, *clusters, cidr, *bin, *exitWhenReady)
	}))
}

func run(ctx context.Context, p *harness.Program, out io.Writer, n int, cidr netip.Prefix, bin string, exitWhenReady bool) {
	harness.Require(p, harness.NeedsNetwork...)
	harness.Require(p, harness.NeedsControlPlane...)
	start := time.Now()
	env := harness.New(p)
	fmt.Fprintf(out, "demo: run %s: starting %d clusters, all with PodCIDR %s\n", env.RunID, n, cidr)
	cidrs := make([]string, n)
	for i := range cidrs {
		cidrs[i] = cidr.String()
	}
	opts := federation.Options{PodCIDRs: cidrs, Flotilla: bin}
	cs := federation.New(p, env, opts)
	for _, c := range cs {
		c.StartAgent(p)
	}
	fmt.Fprintf(out, "demo: control planes up in %.1fs; agents started, waiting for them to connect\n", time.Since(start).Seconds())
	if n > 1 {
		federation.WaitPhases(p, cs, v1alpha1.PhaseConnected, 90*time.Second)
	}
	fmt.Fprintf(out, "\nFederation of %d clusters connected in %.1fs (run %s, files in %s)\n", n, time.Since(start).Seconds(), env.RunID, env.Dir)
	for _, c := range cs {
		fmt.Fprintf(out, "\nCluster %s: API https://%s, gateway netns %s at %s, pod %s\n", c.Name, c.CP.Addr, c.Site.Name, c.Site.Addr, c.Pod.Addr)
		status, err := exec.Command(c.Bin, "status", "--kubeconfig", c.CP.Kubeconfig).CombinedOutput()
		if err != nil {
			p.Fatalf("flotilla status of %s: %v\n%s", c.Name, err, status)
		}
		fmt.Fprintf(out, "%s", status)
	}
	if n > 1 {
		a, b := cs[0], cs[1]
		ex := federation.Exchange(p, a, b)
		fmt.Fprintf(out, "\nPod-to-pod across the overlap: pod %s of %s dialed pod %s of %s as %s (%s's view of %s);\n",
			a.Pod.Addr, a.Name, b.Pod.Addr, b.Name, ex.Dst, a.Name, b.Name)
		if ex.Err != nil {
			p.Fatalf("the exchange failed: %v", ex.Err)
		}
		fmt.Fprintf(out, "%s's pod answered and saw the caller as %s (%s's view of %s). Both pods are %s in their own clusters.\n",
			b.Name, ex.Seen, b.Name, a.Name, a.Pod.Addr)
	}
	c := cs[0]
	fmt.Fprintf(out, "\nTry, for cluster %s:\n", c.Name)
	fmt.Fprintf(out, "  %s --kubeconfig %s get peers -o wide\n", filepath.Join(harness.KubeBinDir(), "kubectl"), c.CP.Kubeconfig)
	fmt.Fprintf(out, "  ip netns exec %s wg show %s\n", c.Site.Name, c.Interface())
	fmt.Fprintf(out, "  ip netns exec %s nft list table ip flotilla\n", c.Site.Name)
	fmt.Fprintf(out, "  ip netns exec %s curl -s http://127.0.0.1:9470/metrics | grep ^flotilla_\n", c.Site.Name)
	fmt.Fprintf(out, "  tail -f %s\n\n", c.Agent.LogPath)
	if exitWhenReady {
		fmt.Fprintln(out, "demo: everything is up; tearing down (-exit-when-ready)")
		return
	}
	fmt.Fprintln(out, "demo: press Ctrl-C to tear everything down")
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "demo: tearing down")
			return
		case <-time.After(time.Second):
			for _, c := range cs {
				if exited, err := c.Agent.Exited(); exited {
					p.Fatalf("agent of cluster %s exited: %v\n%s", c.Name, err, c.Agent.Tail(20))
				}
			}
		}
	}
}
