package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// benchTunnelLimitsEnvVar lists the Go runtime settings the agents run
// under in turn, space-separated. Each is "none" or comma-separated
// settings: a size alone is a GOMEMLIMIT ("96MiB"), others are written
// out ("96MiB,GOGC=50"); "deployment" is deploy/deployment.yaml's.
const benchTunnelLimitsEnvVar = "FLOTILLA_BENCH_TUNNEL_LIMITS"

// runtimeEnv is the environment one entry of FLOTILLA_BENCH_TUNNEL_LIMITS
// sets: none for "none", deploy/deployment.yaml's for "deployment".
func runtimeEnv(tb testing.TB, entry string) []string {
	switch entry {
	case "none":
		return nil
	case "deployment":
		return deployedRuntimeEnv(tb)
	}
	var env []string
	for _, s := range strings.Split(entry, ",") {
		if !strings.Contains(s, "=") {
			s = "GOMEMLIMIT=" + s
		}
		env = append(env, s)
	}
	return env
}

// deployedRuntimeEnv is the Go runtime's settings (GOMEMLIMIT, GOGC, ...)
// in the agent container of deploy/deployment.yaml, as NAME=VALUE.
func deployedRuntimeEnv(tb testing.TB) []string {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "deployment.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.Unmarshal(raw, &d); err != nil {
		tb.Fatalf("deploy/deployment.yaml: %v", err)
	}
	var env []string
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name != "agent" {
			continue
		}
		for _, e := range c.Env {
			if !strings.HasPrefix(e.Name, "GO") {
				continue
			}
			v := e.Value
			if e.ValueFrom != nil {
				v = resourceValue(tb, c, e.ValueFrom.ResourceFieldRef)
			}
			env = append(env, e.Name+"="+v)
		}
		return env
	}
	tb.Fatal("deploy/deployment.yaml: no container named agent")
	return nil
}

// resourceValue is what the downward API gives container c for ref: its
// memory limit in bytes, divided by ref's divisor and rounded up as the
// kubelet does, is the one the deployment uses.
func resourceValue(tb testing.TB, c corev1.Container, ref *corev1.ResourceFieldSelector) string {
	tb.Helper()
	if ref == nil || ref.Resource != "limits.memory" {
		tb.Fatalf("deploy/deployment.yaml: container %s: an environment variable from %+v, want a value or resourceFieldRef limits.memory", c.Name, ref)
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		tb.Fatalf("deploy/deployment.yaml: container %s has no memory limit for its resourceFieldRef limits.memory", c.Name)
	}
	divisor := int64(1)
	if !ref.Divisor.IsZero() {
		divisor = ref.Divisor.Value()
	}
	return strconv.FormatInt((limit.Value()+divisor-1)/divisor, 10)
}

// BenchmarkTunnelUnderMemoryLimit measures what the Go runtime's memory
// settings (GOMEMLIMIT, GOGC) cost the userspace data path, which holds a
// 64 KiB buffer of wireguard-go's for every packet in flight, from pools
// that every collection empties: TCP throughput (iperf3, 5 s) from one
// cluster's pod to the other's through both agents' tunnels, the two
// agents restarted under each setting in turn
// (FLOTILLA_BENCH_TUNNEL_LIMITS, default "none 96MiB deployment": none,
// the limit alone, deploy/deployment.yaml's settings; the order rotates
// each round), with the sending agent's CPU and highest VmRSS during the
// transfer. Run with -benchtime 5x for medians of 5.
func BenchmarkTunnelUnderMemoryLimit(b *testing.B) {
	requireAll(b)
	harness.Require(b, harness.IPerf3)
	limits := strings.Fields(os.Getenv(benchTunnelLimitsEnvVar))
	if len(limits) == 0 {
		limits = []string{"none", "96MiB", "deployment"}
	}
	env := harness.New(b)
	cs := federation.New(b, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16", "10.0.0.0/16"}, Args: []string{"--log-level", "info"}})
	from, to := cs[0], cs[1]
	type launch struct {
		bin  string
		args []string
	}
	plain := map[*federation.Cluster]launch{}
	for _, c := range cs {
		plain[c] = launch{c.Bin, slices.Clone(c.Args)}
	}
	startUnder := func(limit string) {
		b.Helper()
		for _, c := range cs {
			if c.Agent != nil {
				if err := c.Agent.Stop(); err != nil {
					b.Fatalf("stop agent %s: %v", c.Name, err)
				}
			}
			l := plain[c]
			c.Bin, c.Args = l.bin, slices.Clone(l.args)
			if e := runtimeEnv(b, limit); e != nil {
				// env(1) execs the agent: the pid stays the agent's.
				c.Args = append(append(e, l.bin), l.args...)
				c.Bin = "env"
			}
			c.StartAgent(b)
		}
		federation.WaitPhases(b, cs, v1alpha1.PhaseConnected, 90*time.Second)
	}
	to.Pod.Start("iperf3", "iperf3", "-s")

	// Per limit, in rounds: throughput, the sending agent's CPU, its
	// highest VmRSS.
	gbps, cpu, peak := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for i := 0; b.Loop(); i++ {
		for j := range limits {
			limit := limits[(i+j)%len(limits)]
			startUnder(limit)
			dst := federation.ViewOf(b, from, to, to.Pod.Addr)
			// The Peers may still say Connected from before the
			// restart: a reply says the new agents' tunnels carry.
			deadline := time.Now().Add(60 * time.Second)
			for err := from.Pod.Ping(dst); err != nil; err = from.Pod.Ping(dst) {
				if time.Now().After(deadline) {
					b.Fatalf("under %s: %v", limit, err)
				}
			}
			pid := from.Agent.Pid()
			cpuBefore, err := cpuTime(pid)
			if err != nil {
				b.Fatal(err)
			}
			stopRSS := watchPeakRSS(pid)
			start := time.Now()
			out, err := from.Pod.Exec(context.Background(), "iperf3", "-c", dst.String(), "-t", "5", "-J")
			took := time.Since(start)
			highest := stopRSS()
			if err != nil {
				b.Fatalf("under %s: iperf3: %v\n%s", limit, err, out)
			}
			cpuAfter, err := cpuTime(pid)
			if err != nil {
				b.Fatal(err)
			}
			g, err := harness.IPerf3Gbps(out)
			if err != nil {
				b.Fatalf("under %s: %v", limit, err)
			}
			c, p := (cpuAfter-cpuBefore).Seconds()/took.Seconds(), mib(highest)
			gbps[limit], cpu[limit], peak[limit] = append(gbps[limit], g), append(cpu[limit], c), append(peak[limit], p)
			b.Logf("round %d, %s: %.2f Gbit/s, the sending agent %.0f%% of a core, VmRSS up to %.1f MiB", i+1, limit, g, 100*c, p)
		}
	}
	b.StopTimer()
	fmt.Printf("BenchmarkTunnelUnderMemoryLimit: iperf3 through both agents' userspace tunnels, 5 s a transfer; median (min to max) of %d rounds\n", len(gbps[limits[0]]))
	base := medianOf(gbps[limits[0]])
	for _, l := range limits {
		g := gbps[l]
		fmt.Printf("  %-16s %5.2f Gbit/s (%.2f to %.2f), %.2f of %s's; the sending agent %3.0f%% of a core, VmRSS up to %.1f MiB\n",
			l, medianOf(g), slices.Min(g), slices.Max(g), medianOf(g)/base, limits[0], 100*medianOf(cpu[l]), slices.Max(peak[l]))
		b.ReportMetric(medianOf(g), "Gbit/s-"+l)
	}
}

// watchPeakRSS reads process pid's VmRSS every 250 ms until the function
// it returns is called, which returns the highest reading.
func watchPeakRSS(pid int) (stop func() uint64) {
	done := make(chan struct{})
	var highest uint64
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if st, err := procStatus(pid); err == nil {
				highest = max(highest, st["VmRSS"])
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() uint64 {
		close(done)
		wg.Wait()
		return highest
	}
}
