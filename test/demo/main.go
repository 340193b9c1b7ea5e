// Command demo brings up a local federation on this machine: for each
// cluster a real control plane, a network site (the gateway node) on one
// LAN, a pretend kubelet and a flotilla agent. It prints where everything
// is and tears it all down on Ctrl-C. `make demo` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

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
	if err != nil || cidr != cidr.Masked() {
		fmt.Fprintf(os.Stderr, "demo: -pod-cidr %q: want a canonical CIDR such as 10.0.0.0/16\n", *podCIDR)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(harness.RunProgram("demo", os.Stderr, func(p *harness.Program) {
		run(ctx, p, os.Stdout, *clusters, cidr, *bin, *exitWhenReady)
	}))
}

type cluster struct {
	name  string
	cp    *harness.ControlPlane
	site  *harness.Site
	agent *harness.Process
}

func run(ctx context.Context, p *harness.Program, out io.Writer, n int, cidr netip.Prefix, bin string, exitWhenReady bool) {
	harness.Require(p, harness.NeedsNetwork...)
	harness.Require(p, harness.NeedsControlPlane...)
	if bin == "" {
		bin = harness.Flotilla(p)
	}
	start := time.Now()
	env := harness.New(p)
	fmt.Fprintf(out, "demo: run %s: starting %d clusters (control planes take a few seconds)\n", env.RunID, n)
	lan := env.NewLAN("lan")
	cps := env.ControlPlanes(n, harness.ControlPlaneOptions{PodCIDR: cidr})
	var cs []*cluster
	for i, cp := range cps {
		name := string(rune('a' + i))
		site := env.NewSite(name, harness.SiteOptions{LAN: lan, PodCIDR: cidr})
		cp.ExposeTo(site.Netns)
		cp.StartKubelet("gateway-"+name, harness.KubeletOptions{Site: site})
		agent := site.Start("agent-"+name, bin, "agent",
			"--kubeconfig", cp.Kubeconfig,
			"--state-dir", filepath.Join(env.Dir, "state-"+name),
			"--metrics-addr", agentMetrics)
		cs = append(cs, &cluster{name: name, cp: cp, site: site, agent: agent})
	}
	for _, c := range cs {
		if err := waitReady(ctx, c); err != nil {
			p.Fatalf("cluster %s: %v\nlast lines of its agent:\n%s", c.name, err, c.agent.Tail(20))
		}
	}
	printFederation(out, env, cs, time.Since(start))
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
				if exited, err := c.agent.Exited(); exited {
					p.Fatalf("agent of cluster %s exited: %v\n%s", c.name, err, c.agent.Tail(20))
				}
			}
		}
	}
}

// agentMetrics is where each agent serves health and metrics inside its
// own site; every site is its own network namespace, so they do not clash.
const agentMetrics = "127.0.0.1:9470"

// waitReady polls the agent's /readyz from inside its site.
func waitReady(ctx context.Context, c *cluster) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return c.site.DialContext(ctx, network, addr)
		},
	}}
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if exited, err := c.agent.Exited(); exited {
			return fmt.Errorf("agent exited: %v", err)
		}
		resp, err := client.Get("http://" + agentMetrics + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("agent not ready after 60s: %v", last)
}

func printFederation(out io.Writer, env *harness.Env, cs []*cluster, took time.Duration) {
	fmt.Fprintf(out, "\nFederation of %d clusters up in %.1fs (run %s, files in %s)\n\n", len(cs), took.Seconds(), env.RunID, env.Dir)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tAPI SERVER\tGATEWAY NETNS\tGATEWAY ADDR\tPOD CIDR\tAGENT PID")
	for _, c := range cs {
		fmt.Fprintf(w, "%s\thttps://%s\t%s\t%s\t%s\t%d\n", c.name, c.cp.Addr, c.site.Name, c.site.Addr, c.site.PodCIDR, c.agent.Pid())
	}
	w.Flush()
	c := cs[0]
	fmt.Fprintf(out, "\nTry, for cluster %s:\n", c.name)
	fmt.Fprintf(out, "  %s --kubeconfig %s get nodes -o wide\n", filepath.Join(harness.KubeBinDir(), "kubectl"), c.cp.Kubeconfig)
	fmt.Fprintf(out, "  ip netns exec %s curl -s %s/readyz?verbose\n", c.site.Name, "http://"+agentMetrics)
	fmt.Fprintf(out, "  ip netns exec %s curl -s %s/metrics | grep ^flotilla_\n", c.site.Name, "http://"+agentMetrics)
	fmt.Fprintf(out, "  tail -f %s\n\n", c.agent.LogPath)
}
