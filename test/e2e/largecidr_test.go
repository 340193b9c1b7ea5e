package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A cluster whose PodCIDR is larger than any remap pool peers: a is on
// 10.0.0.0/8 (a gateway and a worker, a /24 each), b on 10.244.0.0/16,
// inside a's range, and c on 192.168.0.0/16. a announces its nodes'
// blocks, not the /8, so b and c can map them; every pair connects and
// pods talk by their views. Two workers added to a afterwards get their
// blocks announced, viewed by b and c, and reached from them, and the
// pods b and c reached before keep their addresses.
func TestLargePodCIDRPeers(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	start := time.Now()
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 3,
		PodCIDRs: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("10.244.0.0/16"),
			netip.MustParsePrefix("192.168.0.0/16"),
		},
		WorkersOf: []int{1, 0, 0},
	})
	a := cs[0]
	t.Cleanup(func() {
		if t.Failed() {
			agentErrors(t, env, cs)
		}
	})
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	t.Logf("Peers Connected: %s", time.Since(start).Round(time.Millisecond))

	web := map[*federation.NodeCluster]corev1.Pod{}
	for _, c := range cs {
		web[c] = c.Web
	}
	onWorker := federation.RunWeb(t, a, a.Workers[0], "web-w1")
	talk := func(t *testing.T, aPod corev1.Pod) {
		t.Helper()
		for _, from := range cs {
			for _, to := range cs {
				if from == to {
					continue
				}
				fromPod, toPod := web[from], web[to]
				if from == a {
					fromPod = aPod
				}
				if to == a {
					toPod = aPod
				}
				if r := federation.FetchPods(t, from, fromPod, to, toPod); r.Err != nil {
					t.Errorf("%s/%s -> %s/%s (%s): %v", from.Name, fromPod.Name, to.Name, toPod.Name, r.Dst, r.Err)
				}
			}
		}
	}
	t.Run("a announces its nodes' blocks, not the /8", func(t *testing.T) {
		want := []string{a.Gateway.PodCIDR.String(), a.Workers[0].PodCIDR.String()}
		for _, o := range cs[1:] {
			ranges := theirRanges(t, o, a)
			for _, r := range ranges {
				if r == "10.0.0.0/8" {
					t.Errorf("%s sees a's whole range %s: %v", o.Name, r, ranges)
				}
			}
			for _, w := range want {
				if !coveredBy(netip.MustParsePrefix(w), ranges) {
					t.Errorf("%s's views of a %v do not cover a's node block %s", o.Name, ranges, w)
				}
			}
		}
	})
	t.Run("gateway pods talk", func(t *testing.T) { talk(t, a.Web) })
	t.Run("a's worker pod talks", func(t *testing.T) { talk(t, onWorker) })
	t.Run("workers added to a get their blocks announced and reached", func(t *testing.T) {
		// How b and c address a's pods before: re-aggregating a's blocks
		// (two /24s more make the /23 a /22) must not move them.
		before := map[string]netip.Addr{}
		for _, o := range cs[1:] {
			for _, p := range []corev1.Pod{a.Web, onWorker} {
				before[o.Name+"/"+p.Name] = federation.ViewOf(t, o.Cluster, a.Cluster, netip.MustParseAddr(p.Status.PodIP))
			}
		}
		added := time.Now()
		nodes := a.AddWorkers(t, "w2", "w3")
		registered := time.Now()
		for _, o := range cs[1:] {
			for _, n := range nodes {
				eventually.Within(t, 60*time.Second, o.Name+" views a's new block "+n.PodCIDR.String(), func() error {
					if ranges := theirRanges(t, o, a); !coveredBy(n.PodCIDR, ranges) {
						return fmt.Errorf("%s's views of a: %v", o.Name, ranges)
					}
					return nil
				})
			}
		}
		t.Logf("nodes w2, w3 Ready after %s; their blocks %s, %s viewed by b and c %s after; b sees a's %v",
			registered.Sub(added).Round(time.Millisecond), nodes[0].PodCIDR, nodes[1].PodCIDR,
			time.Since(registered).Round(time.Millisecond), theirRanges(t, cs[1], a))
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 60*time.Second)
		for _, o := range cs[1:] {
			for _, p := range []corev1.Pod{a.Web, onWorker} {
				if now := federation.ViewOf(t, o.Cluster, a.Cluster, netip.MustParseAddr(p.Status.PodIP)); now != before[o.Name+"/"+p.Name] {
					t.Errorf("%s addressed a's pod %s as %s, now as %s", o.Name, p.Name, before[o.Name+"/"+p.Name], now)
				}
			}
		}
		talk(t, federation.RunWeb(t, a, nodes[1], "web-w3"))
		// The pods that talked before still do.
		talk(t, onWorker)
	})
}

// theirRanges are c's Peer of o's theirNetworks ranges.
func theirRanges(t *testing.T, c, o *federation.NodeCluster) []string {
	t.Helper()
	p, ok := mustPeers(t, c.Cluster)[o.Name]
	if !ok {
		t.Fatalf("%s has no Peer for %s", c.Name, o.Name)
	}
	var out []string
	for _, v := range p.Status.TheirNetworks {
		out = append(out, v.Range)
	}
	return out
}

func coveredBy(block netip.Prefix, ranges []string) bool {
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r)
		if err == nil && p.Bits() <= block.Bits() && p.Contains(block.Addr()) {
			return true
		}
	}
	return false
}

// agentErrors writes each agent's log into the run's log directory and
// logs its errors, for a failed run.
func agentErrors(t *testing.T, env *harness.Env, cs []*federation.NodeCluster) {
	for _, c := range cs {
		out, err := federation.Kubectl(c.CP, "-n", federation.AgentNamespace, "logs", "deployment/flotilla-agent")
		if err != nil {
			t.Logf("logs of %s's agent: %v", c.Name, err)
			continue
		}
		path := filepath.Join(env.Dir, "logs", "agent-"+c.Name+".log")
		os.WriteFile(path, []byte(out), 0o644)
		var errs []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, `"level":"ERROR"`) {
				errs = append(errs, l)
			}
		}
		t.Logf("agent of %s: %d lines, %d errors (%s); last errors:\n%s", c.Name, strings.Count(out, "\n"), len(errs), path, strings.Join(errs[max(0, len(errs)-5):], "\n"))
	}
}
