package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The sizes of BenchmarkAgentMemory: FLOTILLA_BENCH_RSS_PODS (default
// 1000) and FLOTILLA_BENCH_RSS_PEERS (default 100, the provider
// included; at least 1).
const (
	benchRSSPodsEnvVar  = "FLOTILLA_BENCH_RSS_PODS"
	benchRSSPeersEnvVar = "FLOTILLA_BENCH_RSS_PEERS"
	// benchRSSAgentEnvVar sets the measured agent's environment instead
	// of deploy/deployment.yaml's Go runtime settings, space-separated:
	// "GOMEMLIMIT=48MiB GOGC=50" shows what the runtime's knobs change,
	// "none" runs it with the runtime's defaults.
	benchRSSAgentEnvVar = "FLOTILLA_BENCH_RSS_AGENT_ENV"
	// benchRSSAgentArgsEnvVar adds flags to the measured agent,
	// space-separated: "--release-start-pages=false" measures the agent
	// keeping its binary's start pages mapped.
	benchRSSAgentArgsEnvVar = "FLOTILLA_BENCH_RSS_AGENT_ARGS"
	// benchRSSProfilesEnvVar names a directory: the agent runs with
	// --profiling and the heap profile at the end of each window is
	// written there (idle-1.pb.gz, idle-all.pb.gz, pods-N.pb.gz) for
	// go tool pprof, with the goroutines grouped by stack beside it
	// (idle-1-goroutines.txt, ...).
	benchRSSProfilesEnvVar = "FLOTILLA_BENCH_RSS_PROFILES"
)

// memWindow is how long each steady state is sampled (every
// memSampleEvery): long enough for a few garbage collections and the
// runtime's return of freed pages.
const (
	memWindow      = 20 * time.Second
	memSampleEvery = 250 * time.Millisecond
)

// The consumer agent's resident memory with 1000 offloaded pods and 100
// peers (target <= 64 MiB; Liqo users report memory out of hand at 7k
// pods, liqotech/liqo #2436). The measured agent is the real binary, a
// process on its site with its own control plane (with a scheduler);
// the provider is a second such cluster, granting offloading, whose
// nodes are the harness's stand-in kubelets. The other 99 peers are the
// test binary run as "swarm" on a third site (swarm_test.go): real
// gossip members with the federation key and real peering engines, each
// with a WireGuard device that answers handshakes, so the consumer holds
// 100 Connected Peers, 100 WireGuard peers with their NAT, and 100 views
// in its ledger. It samples the agent's VmRSS (/proc/PID/status), with
// its anonymous and file-backed parts (RssAnon, RssFile), idle with the
// provider only, idle with every peer, then per round from
// creating a Deployment of 1000 pods in a Remote namespace until all are
// Running here with translated addresses (the ramp), and steady with all
// of them; after each window it reads the Go runtime's metrics and the
// agent's CPU over it. The round ends with the Deployment deleted and its pods
// gone. docs/offload.md has the figures.
func BenchmarkAgentMemory(b *testing.B) {
	pods, peers := envCount(b, benchRSSPodsEnvVar, 1000), envCount(b, benchRSSPeersEnvVar, 100)
	b.Run(fmt.Sprintf("pods=%d,peers=%d", pods, peers), func(b *testing.B) { benchAgentMemory(b, pods, peers) })
}

func envCount(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// swarmMemberMiB is what a swarm member takes: its wireguard-go device
// holds 24 MiB of receive batches, of which the process measured 32 MiB
// resident a member with 99.
const swarmMemberMiB = 40

func benchAgentMemory(b *testing.B, pods, peers int) {
	requireAll(b)
	harness.Require(b, harness.Requirement{
		Name: "memory for two clusters and the swarm",
		Check: func() error {
			if need, have := 2*scaleClusterMiB+(peers-1)*swarmMemberMiB, memAvailableMiB(); have < need {
				return fmt.Errorf("two clusters and %d swarm members need about %d MiB, %d MiB available", peers-1, need, have)
			}
			return nil
		},
		Fix: "a machine with more memory, or fewer peers (FLOTILLA_BENCH_RSS_PEERS)",
	})
	loadBefore := loadAvg()
	env := harness.New(b)
	lan := env.NewLAN("lan")
	// Both clusters on the same pod network: the consumer remaps the
	// provider's, as it does each swarm member's.
	cs := federation.New(b, env, federation.Options{
		PodCIDRs: []string{"10.0.0.0/16", "10.0.0.0/16"}, LAN: lan,
		Args: []string{"--log-level", "info"},
		ArgsFor: func(i int, _ []*federation.Cluster) []string {
			if i == 1 {
				return []string{"--offload-grants=auto"}
			}
			return nil
		},
	})
	cons, prov := cs[0], cs[1]
	profiles := os.Getenv(benchRSSProfilesEnvVar)
	if profiles != "" {
		if err := os.MkdirAll(profiles, 0o755); err != nil {
			b.Fatal(err)
		}
		cons.Args = append(cons.Args, "--profiling")
	}
	agentArgs := strings.Fields(os.Getenv(benchRSSAgentArgsEnvVar))
	cons.Args = append(cons.Args, agentArgs...)
	// The measured agent runs a copy of the binary of its own, as on a
	// node of its own: the provider's agent maps the same file, and the
	// pages it keeps cached would be mapped into the measured one around
	// each of its faults (docs/offload.md, "The fifth round").
	// It is the binary the image holds (static: no libc mapped), not the
	// harness's build.
	measured := copyOfBinary(b, harness.ImageBinary(b))
	cons.Bin = measured
	// The agent runs with the deployment's runtime settings unless told
	// otherwise ("none": the runtime's defaults).
	agentEnv := deployedRuntimeEnv(b)
	if v, ok := os.LookupEnv(benchRSSAgentEnvVar); ok {
		agentEnv = strings.Fields(v)
		if v == "none" {
			agentEnv = nil
		}
	}
	if len(agentEnv) > 0 {
		// env(1) execs the agent: the pid stays the agent's.
		cons.Args = append(append(agentEnv, cons.Bin), cons.Args...)
		cons.Bin = "env"
	}
	installConsumerRole(b, cs[1:])
	// The consumer's API server calls the agent's placement webhook at
	// the agent's address in its site.
	cons.CP.ReachInto(cons.Site.Netns, netip.PrefixFrom(cons.Site.Addr, 32))
	for _, c := range cs {
		// Their defaults (50 a second) would make the ramp the
		// scheduler's; the controller managers keep theirs.
		c.CP.Options.ClientQPS = 1000
		c.CP.StartScheduler()
	}
	// 250 pods a stand-in node at most, and room to spare; a /20 each
	// of 10.0.0.0/16.
	if pods > 15*200 {
		b.Fatalf("%s=%d: at most %d pods (16 stand-in nodes)", benchRSSPodsEnvVar, pods, 15*200)
	}
	for i := range pods/200 + 1 {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(16 * i), 0}), 20)
		prov.CP.StartKubelet(fmt.Sprintf("node%d", i+1), harness.KubeletOptions{PodCIDR: cidr})
	}
	federation.Connect(b, cs)
	waitCredentials(b, cons, cs[1:], 2*time.Minute)
	agent := agentPid(b, cons, measured)

	m := &memReport{pods: pods, peers: peers, env: append(slices.Clone(agentEnv), agentArgs...)}
	m.idleOne = sampleFor(b, cons, agent, memWindow)
	saveHeapProfile(b, cons, profiles, "idle-1")

	if peers > 1 {
		startSwarm(b, env, lan, cons, peers-1)
		waitPeersConnected(b, cons, peers, 5*time.Minute)
	}
	m.idleAll = sampleFor(b, cons, agent, memWindow)
	saveHeapProfile(b, cons, profiles, "idle-all")

	view := offloadRemote(b, cons, prov, "bench")
	for round := 0; b.Loop(); round++ {
		app := fmt.Sprintf("mem-%d", round)
		s := startSampler(agent)
		start := time.Now()
		createPlainDeployment(b, cons, "bench", app, pods)
		waitReflected(b, cons, "bench", app, pods, view, 10*time.Minute)
		ramp := s.stop()
		steady := sampleFor(b, cons, agent, memWindow)
		saveHeapProfile(b, cons, profiles, fmt.Sprintf("pods-%d", round+1))
		m.rounds = append(m.rounds, memRound{took: time.Since(start), rampMax: slices.Max(ramp.rss), steady: steady})
		b.StopTimer()
		deleteAndWaitGone(b, cons, "bench", app, 10*time.Minute)
		b.StartTimer()
	}
	b.StopTimer()
	m.report(b, loadBefore)
}

// memSamples are VmRSS readings split, at each sample, into what the
// resident memory is made of: anonymous (the Go heap, stacks, the
// runtime) against file-backed (the binary's pages that ran); and, read
// once at the end, the Go runtime's own account.
type memSamples struct {
	rss, anon, file []uint64
	// From the agent's metrics at the end: the heap in use, the heap the
	// next collection starts at (twice the live heap: GOGC 100), the
	// heap freed but not yet returned to the system, the stacks, and
	// the goroutines.
	heap, nextGC, heapKept, stacks, goroutines uint64
	// runtime is the runtime's own memory (spans, the collector's
	// metadata, profiling buckets, the rest), gcMeta the collector's part.
	runtime, gcMeta uint64
	// cpu is the share of one core the agent used over the window.
	cpu float64
}

// breakdown says what the resident memory is made of, in MiB.
func (m memSamples) breakdown() string {
	return fmt.Sprintf("anon %s, file %s; Go heap in use %.1f, next GC at %.1f, freed not returned %.1f, stacks %.1f (%d goroutines), the runtime's own %.1f (the collector's %.1f); CPU %.0f%% of a core",
		spreadMiB(m.anon), spreadMiB(m.file), mib(m.heap), mib(m.nextGC), mib(m.heapKept), mib(m.stacks), m.goroutines, mib(m.runtime), mib(m.gcMeta), 100*m.cpu)
}

type memRound struct {
	took    time.Duration
	rampMax uint64 // the highest sample from the Deployment's creation to all pods Running here
	steady  memSamples
}

// peak is the highest sample of the round, with the pods coming or
// there.
func (r memRound) peak() uint64 { return max(r.rampMax, slices.Max(r.steady.rss)) }

type memReport struct {
	pods, peers      int
	env              []string // the agent's added environment
	idleOne, idleAll memSamples
	rounds           []memRound
}

func (m *memReport) report(b *testing.B, loadBefore string) {
	var peaks, steadies, anons, files, heaps []uint64
	for _, r := range m.rounds {
		peaks = append(peaks, r.peak())
		steadies = append(steadies, medianBytes(r.steady.rss))
		anons = append(anons, medianBytes(r.steady.anon))
		files = append(files, medianBytes(r.steady.file))
		heaps = append(heaps, r.steady.heap)
	}
	one, all, withPods := medianBytes(m.idleOne.rss), medianBytes(m.idleAll.rss), medianBytes(steadies)
	b.ReportMetric(mib(one), "MiB-idle-1-peer")
	b.ReportMetric(mib(all), "MiB-idle-all-peers")
	b.ReportMetric(mib(withPods), "MiB-with-pods-median")
	b.ReportMetric(mib(medianBytes(m.idleAll.anon)), "MiB-anon-idle-all-peers")
	b.ReportMetric(mib(medianBytes(anons)), "MiB-anon-with-pods-median")
	b.ReportMetric(mib(medianBytes(files)), "MiB-file-with-pods-median")
	b.ReportMetric(mib(slices.Max(peaks)), "MiB-peak-max")
	if m.peers > 1 {
		b.ReportMetric(kib(int64(all)-int64(one))/float64(m.peers-1), "KiB-per-peer")
	}
	b.ReportMetric(kib(int64(withPods)-int64(all))/float64(m.pods), "KiB-per-pod")
	b.ReportMetric(0, "ns/op")
	var w strings.Builder
	fmt.Fprintf(&w, "BenchmarkAgentMemory pods=%d peers=%d: the consumer agent's VmRSS in MiB, median (min to max) of samples every %v over %v%s\n", m.pods, m.peers, memSampleEvery, memWindow, envNote(m.env))
	fmt.Fprintf(&w, "  idle, the provider its only peer   %s\n    %s\n", spreadMiB(m.idleOne.rss), m.idleOne.breakdown())
	fmt.Fprintf(&w, "  idle, %3d peers Connected          %s\n    %s\n", m.peers, spreadMiB(m.idleAll.rss), m.idleAll.breakdown())
	for i, r := range m.rounds {
		fmt.Fprintf(&w, "  round %d: %d pods Running here in %.1f s; the highest during the ramp %.1f; then %s\n    %s\n",
			i+1, m.pods, r.took.Seconds(), mib(r.rampMax), spreadMiB(r.steady.rss), r.steady.breakdown())
	}
	fmt.Fprintf(&w, "  with %d pods, median of rounds %.1f (%.1f to %.1f): anon %.1f (%.1f to %.1f), file %.1f (%.1f to %.1f); Go heap in use %.1f; the highest sample %.1f; target 64\n",
		m.pods, mib(withPods), mib(slices.Min(steadies)), mib(slices.Max(steadies)),
		mib(medianBytes(anons)), mib(slices.Min(anons)), mib(slices.Max(anons)),
		mib(medianBytes(files)), mib(slices.Min(files)), mib(slices.Max(files)),
		mib(medianBytes(heaps)), mib(slices.Max(peaks)))
	if m.peers > 1 {
		fmt.Fprintf(&w, "  per peer %.0f KiB (idle, %d peers less 1); ", kib(int64(all)-int64(one))/float64(m.peers-1), m.peers)
	} else {
		w.WriteString("  ")
	}
	fmt.Fprintf(&w, "per pod %.1f KiB (with pods less idle)\n  load %s -> %s\n", kib(int64(withPods)-int64(all))/float64(m.pods), loadBefore, loadAvg())
	fmt.Fprint(os.Stdout, w.String())
}

func envNote(env []string) string {
	if len(env) == 0 {
		return ""
	}
	return "; the agent with " + strings.Join(env, " ")
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
func kib(n int64) float64  { return float64(n) / (1 << 10) }

func medianBytes(xs []uint64) uint64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func spreadMiB(xs []uint64) string {
	return fmt.Sprintf("%.1f (%.1f to %.1f)", mib(medianBytes(xs)), mib(slices.Min(xs)), mib(slices.Max(xs)))
}

// agentPid is the pid of c's agent process, checked to be the flotilla
// binary (the harness starts it through ip netns exec, which execs it).
func agentPid(b *testing.B, c *federation.Cluster, want string) int {
	b.Helper()
	pid := c.Agent.Pid()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || exe != want {
		b.Fatalf("process %d of agent %s is %q (%v), not %s", pid, c.Name, exe, err, want)
	}
	return pid
}

// rssOf reads the resident set size of process pid and its anonymous
// and file-backed parts.
func rssOf(pid int) (rss, anon, file uint64, err error) {
	st, err := procStatus(pid)
	if err != nil {
		return 0, 0, 0, err
	}
	return st["VmRSS"], st["RssAnon"], st["RssFile"], nil
}

// cpuTime is the CPU time process pid used so far (user and system,
// /proc/PID/stat; clock ticks of 10 ms, USER_HZ on Linux).
func cpuTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields count from after it.
	_, rest, ok := strings.Cut(string(raw), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, raw)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// procStatus reads the sizes in /proc/PID/status, in bytes by name
// (VmRSS, RssAnon, RssFile, ...).
func procStatus(pid int) (map[string]uint64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "kB" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status: %q: %w", pid, line, err)
			}
			out[strings.TrimSuffix(f[0], ":")] = kb << 10
		}
	}
	if _, ok := out["VmRSS"]; !ok {
		return nil, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return out, nil
}

// sampler reads VmRSS, RssAnon and RssFile every memSampleEvery until
// stopped.
type sampler struct {
	pid  int
	mu   sync.Mutex
	m    memSamples
	err  error
	done chan struct{}
	wg   sync.WaitGroup
}

func startSampler(pid int) *sampler {
	s := &sampler{pid: pid, done: make(chan struct{})}
	s.wg.Go(func() {
		t := time.NewTicker(memSampleEvery)
		defer t.Stop()
		for {
			rss, anon, file, err := rssOf(pid)
			s.mu.Lock()
			if err != nil && s.err == nil {
				s.err = err
			}
			if err == nil {
				s.m.rss, s.m.anon, s.m.file = append(s.m.rss, rss), append(s.m.anon, anon), append(s.m.file, file)
			}
			s.mu.Unlock()
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	})
	return s
}

func (s *sampler) stop() memSamples {
	close(s.done)
	s.wg.Wait()
	return s.m
}

// sampleFor samples c's agent for d, then reads its Go heap in use.
func sampleFor(b *testing.B, c *federation.Cluster, pid int, d time.Duration) memSamples {
	b.Helper()
	cpuBefore, err := cpuTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	s := startSampler(pid)
	time.Sleep(d)
	m := s.stop()
	cpuAfter, err := cpuTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	m.cpu = (cpuAfter - cpuBefore).Seconds() / d.Seconds()
	if s.err != nil {
		b.Fatalf("read the memory of agent %s: %v\n%s", c.Name, s.err, c.Agent.Tail(20))
	}
	metrics, err := runtimeMetrics(c.Site)
	if err != nil {
		b.Fatalf("the Go runtime metrics of agent %s: %v", c.Name, err)
	}
	m.heap, m.nextGC, m.stacks, m.goroutines = metrics["go_memstats_heap_inuse_bytes"], metrics["go_memstats_next_gc_bytes"], metrics["go_memstats_stack_inuse_bytes"], metrics["go_goroutines"]
	m.heapKept = metrics["go_memstats_heap_idle_bytes"] - metrics["go_memstats_heap_released_bytes"]
	m.gcMeta = metrics["go_memstats_gc_sys_bytes"]
	m.runtime = m.gcMeta + metrics["go_memstats_mspan_inuse_bytes"] + metrics["go_memstats_mcache_inuse_bytes"] +
		metrics["go_memstats_buck_hash_sys_bytes"] + metrics["go_memstats_other_sys_bytes"]
	return m
}

// saveHeapProfile writes c's agent's heap profile to dir/name.pb.gz; no
// dir, nothing.
func saveHeapProfile(b *testing.B, c *federation.Cluster, dir, name string) {
	b.Helper()
	if dir == "" {
		return
	}
	body, err := getRetried(c.Site, "http://127.0.0.1:9470/debug/pprof/heap")
	if err != nil {
		b.Fatalf("the heap profile of agent %s: %v", c.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".pb.gz"), []byte(body), 0o644); err != nil {
		b.Fatal(err)
	}
	// The goroutines grouped by stack, as text: who started how many.
	body, err = getRetried(c.Site, "http://127.0.0.1:9470/debug/pprof/goroutine?debug=1")
	if err != nil {
		b.Fatalf("the goroutines of agent %s: %v", c.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-goroutines.txt"), []byte(body), 0o644); err != nil {
		b.Fatal(err)
	}
}

// getRetried is getIn tried up to three times: a profile of an agent on
// a loaded machine can take longer than getIn's 2 s once.
func getRetried(s *harness.Site, url string) (string, error) {
	var err error
	for range 3 {
		var body string
		if body, err = getIn(s, url); err == nil {
			return body, nil
		}
	}
	return "", err
}

// runtimeMetrics are the agent's unlabelled metrics in s by name.
func runtimeMetrics(s *harness.Site) (map[string]uint64, error) {
	body, err := getIn(s, "http://127.0.0.1:9470/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for line := range strings.SplitSeq(body, "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			out[name] = uint64(f)
		}
	}
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_next_gc_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes",
		"go_memstats_gc_sys_bytes", "go_memstats_mspan_inuse_bytes", "go_memstats_mcache_inuse_bytes", "go_memstats_buck_hash_sys_bytes", "go_memstats_other_sys_bytes"} {
		if _, ok := out[name]; !ok {
			return nil, fmt.Errorf("no metric %s", name)
		}
	}
	return out, nil
}

// swarmPorts: the swarm's members gossip on 8000+i and run WireGuard on
// 52000+i of the swarm's site.
const (
	swarmGossipPort    = 8000
	swarmWireGuardPort = 52000
)

// startSwarm runs n swarm members on a new site of lan, joined to c's
// gossip with its federation key.
func startSwarm(b *testing.B, env *harness.Env, lan *harness.LAN, c *federation.Cluster, n int) {
	b.Helper()
	site := env.NewSite("swarm", harness.SiteOptions{LAN: lan})
	cfg, err := json.Marshal(swarmConfig{
		Token:     c.Args[indexOf(c.Args, "--federation-key")+1],
		Advertise: site.Addr, GossipPort: swarmGossipPort, WireGuardPort: swarmWireGuardPort,
		Hub: netip.AddrPortFrom(c.Site.Addr, 7946), Peers: n,
		Network: netip.MustParsePrefix("10.0.0.0/20"), Dir: filepath.Join(env.Dir, "swarm"),
	})
	if err != nil {
		b.Fatal(err)
	}
	// In a file, not on the command line: it holds the federation key.
	site.Start("swarm", os.Args[0], "swarm", env.WriteFile("swarm.json", cfg))
}

// waitPeersConnected waits until c has n Peers, all Connected.
func waitPeersConnected(b *testing.B, c *federation.Cluster, n int, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		peers, err := c.Peers(context.Background())
		connected := 0
		phases := map[v1alpha1.Phase]int{}
		for _, p := range peers {
			phases[p.Status.Phase]++
			if p.Status.Phase == v1alpha1.PhaseConnected {
				connected++
			}
		}
		if err == nil && connected >= n {
			return
		}
		if exited, xerr := c.Agent.Exited(); exited {
			b.Fatalf("agent of %s exited: %v\n%s", c.Name, xerr, c.Agent.Tail(30))
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s has %d of %d Peers Connected after %s (err %v); by phase: %v", c.Name, connected, n, timeout, err, phases)
		}
		time.Sleep(time.Second)
	}
}

// offloadRemote offloads namespace ns of cons to prov with its pods
// Remote, waits until it is Ready and the virtual node of prov is Ready,
// and returns cons's view of prov's pod network.
func offloadRemote(b *testing.B, cons, prov *federation.Cluster, ns string) netip.Prefix {
	b.Helper()
	ctx := context.Background()
	if _, err := cons.CP.Client.CoreV1().Namespaces().Create(ctx, namespaceNamed(ns), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	nso := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"},
		Spec: v1alpha1.NamespaceOffloadSpec{PodOffloading: v1alpha1.PodsRemote}}
	if err := cons.Client.Create(ctx, nso); err != nil {
		b.Fatal(err)
	}
	peers, err := cons.Peers(ctx)
	if err != nil {
		b.Fatal(err)
	}
	p := peers[prov.Name]
	if len(p.Status.TheirNetworks) == 0 {
		b.Fatalf("%s has no view of %s's networks: %+v", cons.Name, prov.Name, p.Status)
	}
	view := netip.MustParsePrefix(p.Status.TheirNetworks[0].As)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var got v1alpha1.NamespaceOffload
		err := cons.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "offload"}, &got)
		node, nerr := cons.CP.Client.CoreV1().Nodes().Get(ctx, offload.VirtualNodeName(p.Name), metav1.GetOptions{})
		if err == nil && got.Status.Phase == v1alpha1.OffloadReady && nerr == nil && nodeReady(node) {
			return view
		}
		if time.Now().After(deadline) {
			b.Fatalf("namespace %s offloaded to %s not Ready with its virtual node after 2 minutes: %v %q, node %v", ns, prov.Name, err, got.Status.Phase, nerr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// createPlainDeployment creates a Deployment of n pods labelled app=name
// with nothing of placement: the agent's webhook adds it.
func createPlainDeployment(b *testing.B, c *federation.Cluster, ns, name string, n int) {
	b.Helper()
	replicas := int32(n)
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
			},
		},
	}
	if _, err := c.CP.Client.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// waitReflected waits until n pods app=name in ns of c are Running with
// an address in view (the provider's pods as c sees them).
func waitReflected(b *testing.B, c *federation.Cluster, ns, name string, n int, view netip.Prefix, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		list, err := c.CP.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name, ResourceVersion: "0"})
		running := 0
		if err == nil {
			for _, p := range list.Items {
				ip, perr := netip.ParseAddr(p.Status.PodIP)
				if p.Status.Phase == corev1.PodRunning && perr == nil && view.Contains(ip) {
					running++
				}
			}
		}
		if err == nil && running >= n {
			return
		}
		if exited, xerr := c.Agent.Exited(); exited {
			b.Fatalf("agent of %s exited: %v\n%s", c.Name, xerr, c.Agent.Tail(30))
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d pods app=%s Running in %s on %s with an address in %s after %s (err %v)", running, n, name, ns, c.Name, view, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// deleteAndWaitGone deletes Deployment name and waits until its pods are
// gone from c (each waits for its pod on the provider to go first).
func deleteAndWaitGone(b *testing.B, c *federation.Cluster, ns, name string, timeout time.Duration) {
	b.Helper()
	ctx := context.Background()
	background := metav1.DeletePropagationBackground
	if err := c.CP.Client.AppsV1().Deployments(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		list, err := c.CP.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err == nil && len(list.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pods app=%s in %s on %s not gone after %s (err %v)", name, ns, c.Name, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

// copyOfBinary copies the executable bin beside it (where the sites,
// with their own /tmp, find it too) and returns the copy's path; the
// copy goes when the benchmark ends. It is written as a container
// runtime extracts an image's layer, 32 KiB at a time (the page cache
// then holds it in folios of that size; one write of the whole file
// makes folios of up to 2 MiB, each mapped whole by a fault in it),
// and synced: its cached pages are clean, as a binary's long written,
// which the agent's --evict-start-pages can drop.
func copyOfBinary(b *testing.B, bin string) string {
	b.Helper()
	data, err := os.ReadFile(bin)
	if err != nil {
		b.Fatal(err)
	}
	dst := bin + "-measured"
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.Remove(dst) })
	for off := 0; off < len(data); off += 32 << 10 {
		if _, err := f.Write(data[off:min(off+32<<10, len(data))]); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return dst
}
