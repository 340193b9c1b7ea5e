package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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

// The sizes of BenchmarkAgentMemory: FLOTILLA_BENCH_RSS_PODS and
// FLOTILLA_BENCH_RSS_PEERS (the provider included; at least 1).
const (
	benchRSSPodsEnvVar  = "FLOTILLA_BENCH_RSS_PODS"
	benchRSSPeersEnvVar = "FLOTILLA_BENCH_RSS_PEERS"
	// benchRSSAgentArgsEnvVar adds flags to the measured agent,
	// space-separated.
	benchRSSAgentArgsEnvVar = "FLOTILLA_BENCH_RSS_AGENT_ARGS"
	// benchRSSProfilesEnvVar names a directory: the agent runs with
	// --profiling and the heap profile at the end of each window is
	// written there (idle-1.pb.gz, idle-all.pb.gz, pods-N.pb.gz) for
	// go tool pprof, with the goroutines grouped by stack beside it
	// (idle-1-goroutines.txt, ...).
	benchRSSProfilesEnvVar = "FLOTILLA_BENCH_RSS_PROFILES"
)

// The targets, at memTargetPods offloaded pods and memTargetPeers peers:
// the container's working set and the agent's anonymous memory (the Go
// heap, stacks and the runtime's own), in MiB.
const (
	memTargetPods, memTargetPeers = 1000, 100
	memTargetWorkingSetMiB        = 64
	memTargetAnonMiB              = 40
)

// memWindow is how long each steady state is sampled (every
// memSampleEvery; the agent's metrics every memScrapeEvery): long
// enough for a few garbage collections and the runtime's return of
// freed pages.
const (
	memWindow      = 20 * time.Second
	memSampleEvery = 250 * time.Millisecond
	memScrapeEvery = 5 * time.Second
)

// The consumer agent's memory with offloaded pods and peers, as the
// kubelet and `kubectl top` see it: the working set of the agent's
// container (its cgroup's usage less the inactive page cache). The
// agent runs as deploy/ installs it, a pod of its image (built from this
// checkout) on a real node (kubelet, containerd), with its deployment's
// limits and Go runtime settings. Beside the working set: the agent's Go
// heap in use (its /metrics) and its process's anonymous memory
// (RssAnon, the heap included), and the cgroup's anonymous memory, page
// cache and mapped page cache.
//
// The provider is a second cluster of real nodes, granting offloading,
// whose offloaded pods run on the harness's stand-in kubelets (its real
// node is cordoned). The other peers are the test binary run as "swarm"
// on a site of the nodes' LAN (swarm_test.go): real gossip members with
// the federation key and real peering engines, each with a WireGuard
// device that answers handshakes, so the consumer holds that many
// Connected Peers, WireGuard peers with their NAT, and views in its
// ledger. Windows: idle with the provider only, idle with every peer,
// then per round from creating a Deployment of the pods in a Remote
// namespace until all are Running here with translated addresses (the
// ramp), and steady with all of them. The round ends with the Deployment
// deleted and its pods gone.
//
// The default size (200 pods, 20 peers) fits `make bench`; the targets
// are for 1000 pods and 100 peers:
//
//	FLOTILLA_BENCH_RSS_PODS=1000 FLOTILLA_BENCH_RSS_PEERS=100 \
//	    go test ./test/e2e -run '^$' -bench BenchmarkAgentMemory -benchtime 3x -timeout 60m
func BenchmarkAgentMemory(b *testing.B) {
	pods, peers := envCount(b, benchRSSPodsEnvVar, 200), envCount(b, benchRSSPeersEnvVar, 20)
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

// nodeClusterMiB is what a cluster of one real node takes with its
// control plane and the agent (about 650 MiB, measured), with
// room for the provider's stand-in kubelets.
const nodeClusterMiB = 900

// standInPodsPerNode is how many of the provider's pods a stand-in
// kubelet is given room for (each has a /24 and 250 pods' capacity).
const standInPodsPerNode = 200

// swarmMemory requires the memory for two clusters of one real node and
// a swarm of peers-1 members; peersEnvVar sets peers.
func swarmMemory(peers int, peersEnvVar string) harness.Requirement {
	return harness.Requirement{
		Name: "memory for two clusters and the swarm",
		Check: func() error {
			if need, have := 2*nodeClusterMiB+(peers-1)*swarmMemberMiB, memAvailableMiB(); have < need {
				return fmt.Errorf("two clusters and %d swarm members need about %d MiB, %d MiB available", peers-1, need, have)
			}
			return nil
		},
		Fix: "a machine with more memory, or fewer peers (" + peersEnvVar + ")",
	}
}

func benchAgentMemory(b *testing.B, pods, peers int) {
	harness.Require(b, harness.NeedsNodes...)
	harness.Require(b, swarmMemory(peers, benchRSSPeersEnvVar))
	if pods > 15*standInPodsPerNode {
		b.Fatalf("%s=%d: at most %d pods", benchRSSPodsEnvVar, pods, 15*standInPodsPerNode)
	}
	loadBefore := loadAvg()
	consArgs := strings.Fields(os.Getenv(benchRSSAgentArgsEnvVar))
	profiles := os.Getenv(benchRSSProfilesEnvVar)
	if profiles != "" {
		if err := os.MkdirAll(profiles, 0o755); err != nil {
			b.Fatal(err)
		}
		consArgs = append(consArgs, "--profiling")
	}
	env := harness.New(b)
	// Both clusters on the same pod network: the consumer remaps the
	// provider's, as it does each swarm member's. The controller
	// managers' and schedulers' defaults (20 and 50 requests a second)
	// would make the ramp theirs.
	cs := federation.OnNodes(b, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), ClientQPS: 1000,
		ArgsFor: func(i int) []string {
			if i == 1 {
				return []string{"--offload-grants=auto"}
			}
			return append([]string{"--offload-to=auto"}, consArgs...)
		},
	})
	cons, prov := cs[0], cs[1]
	federation.WaitPhases(b, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	federation.WaitOffloadCredential(b, cons, prov.Name, 60*time.Second)
	// The offloaded pods go to stand-in kubelets, not the real node.
	if out, err := federation.Kubectl(prov.CP, "cordon", prov.Gateway.NodeName); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	for i := range pods/standInPodsPerNode + 1 {
		prov.CP.StartKubelet(fmt.Sprintf("standin%d", i+1), harness.KubeletOptions{})
	}
	agent := agentContainerOf(b, cons)

	m := &memReport{pods: pods, peers: peers, args: consArgs, cgroup: agent.cgroup}
	m.idleOne = agent.sampleFor(b, memWindow)
	saveHeapProfile(b, cons, profiles, "idle-1")

	if peers > 1 {
		startSwarm(b, env, cons, cons.Gateway.Addr, peers-1)
		waitPeersConnected(b, cons, peers, 5*time.Minute)
	}
	m.idleAll = agent.sampleFor(b, memWindow)
	saveHeapProfile(b, cons, profiles, "idle-all")

	view := offloadRemote(b, cons, prov, "bench")
	for round := 0; b.Loop(); round++ {
		app := fmt.Sprintf("mem-%d", round)
		s := agent.startSampler()
		start := time.Now()
		createPlainDeployment(b, cons.Cluster, "bench", app, pods)
		waitReflected(b, cons, "bench", app, pods, view, 10*time.Minute)
		ramp := s.stop()
		steady := agent.sampleFor(b, memWindow)
		saveHeapProfile(b, cons, profiles, fmt.Sprintf("pods-%d", round+1))
		m.rounds = append(m.rounds, memRound{took: time.Since(start), rampMax: slices.Max(ramp.workingSet), steady: steady})
		b.StopTimer()
		deleteAndWaitGone(b, cons, "bench", app, 10*time.Minute)
		b.StartTimer()
	}
	b.StopTimer()
	agent.checkSame(b)
	m.report(b, loadBefore)
}

// agentContainer is the measured agent: its container's process, as the
// node's containerd started it, and its memory cgroup.
type agentContainer struct {
	c       *federation.NodeCluster
	node    *harness.Node // the pod's
	pod     corev1.Pod
	pid     int
	cgroup  harness.MemoryCgroup
	started time.Time
}

// agentContainerOf finds c's agent container on its gateway node.
func agentContainerOf(b testing.TB, c *federation.NodeCluster) *agentContainer {
	b.Helper()
	pod, err := c.AgentPod(context.Background())
	if err != nil {
		b.Fatalf("agent pod of %s: %v", c.Name, err)
	}
	return agentContainerIn(b, c, pod, c.Gateway)
}

// agentContainerIn finds the container of c's agent pod on node.
func agentContainerIn(b testing.TB, c *federation.NodeCluster, pod corev1.Pod, node *harness.Node) *agentContainer {
	b.Helper()
	if len(pod.Status.ContainerStatuses) != 1 {
		b.Fatalf("agent pod %s of %s: %d containers", pod.Name, c.Name, len(pod.Status.ContainerStatuses))
	}
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := node.Ctr(context.Background(), "tasks", "ls")
	if err != nil {
		b.Fatal(err)
	}
	a := &agentContainer{c: c, node: node, pod: pod}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			a.pid, _ = strconv.Atoi(f[1])
		}
	}
	if a.pid == 0 {
		b.Fatalf("no task of the agent's container %s on %s's node %s:\n%s", id, c.Name, pod.Spec.NodeName, out)
	}
	if a.cgroup, err = node.MemoryCgroupOf(a.pid); err != nil {
		b.Fatalf("agent of %s: %v", c.Name, err)
	}
	return a
}

// checkSame fails if the agent's container restarted (why, if it did:
// an OOM kill shows here) or its process is another.
func (a *agentContainer) checkSame(b testing.TB) {
	b.Helper()
	p, err := a.c.CP.Client.CoreV1().Pods(a.pod.Namespace).Get(context.Background(), a.pod.Name, metav1.GetOptions{})
	if err != nil {
		b.Fatalf("agent pod of %s: %v", a.c.Name, err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			b.Fatalf("agent container of %s restarted %d times, last: %+v", a.c.Name, s.RestartCount, s.LastTerminationState.Terminated)
		}
	}
}

// memSamples are the readings of one window: per sample, the cgroup's
// memory and the process's anonymous memory; per scrape of the agent's
// metrics, the Go heap in use; and, from the last scrape, what the
// runtime's memory is made of.
type memSamples struct {
	workingSet, usage, cgAnon, cgFile, mappedFile, anon []uint64
	// rssFile is the binary's pages the process maps (RssFile), which
	// the cgroup is charged for only if they came into the page cache
	// by its own faults: the image's files were written by containerd.
	rssFile []uint64
	heap    []uint64
	// From the agent's metrics at the end: the heap the next collection
	// starts at, the heap freed but not yet returned to the system, the
	// stacks and the goroutines; runtime is the runtime's own memory
	// (spans, the collector's metadata, the rest).
	nextGC, heapKept, stacks, goroutines, runtime uint64
	// cpu is the share of one core the agent used over the window.
	cpu float64
}

// breakdown says what the working set is made of, in MiB.
func (m memSamples) breakdown() string {
	return fmt.Sprintf("cgroup: usage %s, anon %s, page cache %s (mapped %s); RssAnon %s, RssFile %s; Go heap %s, next GC at %.1f, freed not returned %.1f, stacks %.1f (%d goroutines), the runtime's own %.1f; CPU %.0f%% of a core",
		spreadMiB(m.usage), spreadMiB(m.cgAnon), spreadMiB(m.cgFile), spreadMiB(m.mappedFile), spreadMiB(m.anon), spreadMiB(m.rssFile), spreadMiB(m.heap),
		mib(m.nextGC), mib(m.heapKept), mib(m.stacks), m.goroutines, mib(m.runtime), 100*m.cpu)
}

// sampler reads the agent's memory every memSampleEvery and its metrics
// every memScrapeEvery until stopped.
type sampler struct {
	a    *agentContainer
	mu   sync.Mutex
	m    memSamples
	last map[string]uint64 // the last metrics scraped
	err  error
	done chan struct{}
	wg   sync.WaitGroup
}

func (a *agentContainer) startSampler() *sampler {
	s := &sampler{a: a, done: make(chan struct{})}
	s.wg.Go(func() {
		t := time.NewTicker(memSampleEvery)
		defer t.Stop()
		lastScrape := time.Time{}
		for {
			s.sample()
			if time.Since(lastScrape) >= memScrapeEvery {
				lastScrape = time.Now()
				s.scrape()
			}
			select {
			case <-s.done:
				s.scrape()
				return
			case <-t.C:
			}
		}
	})
	return s
}

func (s *sampler) sample() {
	cg, err := s.a.cgroup.Read()
	var st map[string]uint64
	if err == nil {
		st, err = procStatus(s.a.pid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	m := &s.m
	m.workingSet, m.usage = append(m.workingSet, cg.WorkingSet()), append(m.usage, cg.Usage)
	m.cgAnon, m.cgFile, m.mappedFile = append(m.cgAnon, cg.Anon), append(m.cgFile, cg.File), append(m.mappedFile, cg.MappedFile)
	m.anon, m.rssFile = append(m.anon, st["RssAnon"]), append(m.rssFile, st["RssFile"])
}

// scrape reads the agent's metrics; one that fails (a busy agent's
// answer may take longer than agentGet waits) is left out.
func (s *sampler) scrape() {
	metrics, err := runtimeMetrics(s.a.c, s.a.node)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m.heap = append(s.m.heap, metrics["go_memstats_heap_inuse_bytes"])
	s.last = metrics
}

func (s *sampler) stop() memSamples {
	close(s.done)
	s.wg.Wait()
	return s.m
}

// sampleFor samples the agent for d, with its CPU over d.
func (a *agentContainer) sampleFor(b *testing.B, d time.Duration) memSamples {
	b.Helper()
	a.checkSame(b)
	cpuBefore, err := cpuTime(a.pid)
	if err != nil {
		b.Fatalf("agent of %s: %v", a.c.Name, err)
	}
	s := a.startSampler()
	time.Sleep(d)
	m := s.stop()
	cpuAfter, err := cpuTime(a.pid)
	if err != nil {
		b.Fatalf("agent of %s: %v", a.c.Name, err)
	}
	m.cpu = (cpuAfter - cpuBefore).Seconds() / d.Seconds()
	if s.err != nil {
		b.Fatalf("read the memory of agent %s: %v", a.c.Name, s.err)
	}
	if s.last == nil {
		b.Fatalf("the Go runtime metrics of agent %s: not one scrape answered in %v", a.c.Name, d)
	}
	l := s.last
	m.nextGC, m.stacks, m.goroutines = l["go_memstats_next_gc_bytes"], l["go_memstats_stack_inuse_bytes"], l["go_goroutines"]
	m.heapKept = l["go_memstats_heap_idle_bytes"] - l["go_memstats_heap_released_bytes"]
	m.runtime = l["go_memstats_gc_sys_bytes"] + l["go_memstats_mspan_inuse_bytes"] + l["go_memstats_mcache_inuse_bytes"] +
		l["go_memstats_buck_hash_sys_bytes"] + l["go_memstats_other_sys_bytes"]
	return m
}

type memRound struct {
	took    time.Duration
	rampMax uint64 // the highest working set from the Deployment's creation to all pods Running here
	steady  memSamples
}

type memReport struct {
	pods, peers      int
	args             []string // the agent's added flags
	cgroup           harness.MemoryCgroup
	idleOne, idleAll memSamples
	rounds           []memRound
}

// memFigure is one quantity of the report: its median in a window.
type memFigure struct {
	name string
	of   func(memSamples) []uint64
}

var memFigures = []memFigure{
	{"working set", func(m memSamples) []uint64 { return m.workingSet }},
	{"Go heap in use", func(m memSamples) []uint64 { return m.heap }},
	{"anonymous (RssAnon)", func(m memSamples) []uint64 { return m.anon }},
	{"binary mapped (RssFile)", func(m memSamples) []uint64 { return m.rssFile }},
}

func (m *memReport) report(b *testing.B, loadBefore string) {
	var w strings.Builder
	version := "v1"
	if m.cgroup.V2 {
		version = "v2"
	}
	fmt.Fprintf(&w, "BenchmarkAgentMemory pods=%d peers=%d: the consumer agent, a pod of its image on a real node (cgroup %s, %s)%s; MiB, median (min to max) of samples every %v over %v\n",
		m.pods, m.peers, version, m.cgroup.Dir, argsNote(m.args), memSampleEvery, memWindow)
	fmt.Fprintf(&w, "  %-34s %-22s %-22s %s\n", "", memFigures[0].name, memFigures[1].name, memFigures[2].name)
	line := func(state string, s memSamples) {
		fmt.Fprintf(&w, "  %-34s %-22s %-22s %s\n", state, spreadMiB(s.workingSet), spreadMiB(s.heap), spreadMiB(s.anon))
	}
	line("idle, the provider its only peer", m.idleOne)
	fmt.Fprintf(&w, "    %s\n", m.idleOne.breakdown())
	line(fmt.Sprintf("idle, %d peers Connected", m.peers), m.idleAll)
	fmt.Fprintf(&w, "    %s\n", m.idleAll.breakdown())
	for i, r := range m.rounds {
		line(fmt.Sprintf("round %d, %d pods", i+1, m.pods), r.steady)
		fmt.Fprintf(&w, "    all Running here in %.1f s, the highest working set during the ramp %.1f; %s\n", r.took.Seconds(), mib(r.rampMax), r.steady.breakdown())
	}
	fmt.Fprintf(&w, "  with %d pods and %d peers, the rounds' medians, median (min to max) of %d rounds:\n", m.pods, m.peers, len(m.rounds))
	withPods := map[string]uint64{}
	for _, f := range memFigures {
		var medians []uint64
		for _, r := range m.rounds {
			medians = append(medians, medianBytes(f.of(r.steady)))
		}
		withPods[f.name] = medianBytes(medians)
		fmt.Fprintf(&w, "    %-22s %s\n", f.name, spreadMiB(medians))
	}
	var peaks []uint64
	for _, r := range m.rounds {
		peaks = append(peaks, max(r.rampMax, slices.Max(r.steady.workingSet)))
	}
	fmt.Fprintf(&w, "    the highest working set of any sample: %.1f\n", mib(slices.Max(peaks)))
	// The kubelet charges the container only for the page cache its
	// own faults brought in; were the binary's pages evicted and read
	// again by the agent, its working set would hold those it maps.
	var charged []uint64
	for _, r := range m.rounds {
		s := r.steady
		charged = append(charged, medianBytes(s.workingSet)+medianBytes(s.rssFile)-min(medianBytes(s.rssFile), medianBytes(s.mappedFile)))
	}
	fmt.Fprintf(&w, "    the working set were the binary's mapped pages charged to the container: %s\n", spreadMiB(charged))
	w.WriteString("  slopes, KiB:\n")
	for _, f := range memFigures {
		one, all := medianBytes(f.of(m.idleOne)), medianBytes(f.of(m.idleAll))
		if m.peers > 1 {
			fmt.Fprintf(&w, "    %-22s per peer %6.1f (idle with %d peers less idle with 1)", f.name, kib(int64(all)-int64(one))/float64(m.peers-1), m.peers)
		} else {
			fmt.Fprintf(&w, "    %-22s", f.name)
		}
		var perPod []float64
		for _, r := range m.rounds {
			perPod = append(perPod, kib(int64(medianBytes(f.of(r.steady)))-int64(all))/float64(m.pods))
		}
		fmt.Fprintf(&w, "; per pod %.2f (%.2f to %.2f) (with the pods less idle, over the rounds)\n", medianOf(perPod), slices.Min(perPod), slices.Max(perPod))
		b.ReportMetric(medianOf(perPod), "KiB-per-pod-"+metricName(f.name))
		if m.peers > 1 {
			b.ReportMetric(kib(int64(all)-int64(one))/float64(m.peers-1), "KiB-per-peer-"+metricName(f.name))
		}
		b.ReportMetric(mib(withPods[f.name]), "MiB-with-pods-"+metricName(f.name))
	}
	ws, anon := mib(withPods["working set"]), mib(withPods["anonymous (RssAnon)"])
	if m.pods == memTargetPods && m.peers == memTargetPeers {
		fmt.Fprintf(&w, "  targets: working set %.1f, target <= %d: %s; anonymous (the heap included) %.1f, target <= %d: %s\n",
			ws, memTargetWorkingSetMiB, metOrNot(ws <= memTargetWorkingSetMiB), anon, memTargetAnonMiB, metOrNot(anon <= memTargetAnonMiB))
	} else {
		fmt.Fprintf(&w, "  targets (working set <= %d MiB, anonymous <= %d MiB) are for %d pods and %d peers: set %s and %s\n",
			memTargetWorkingSetMiB, memTargetAnonMiB, memTargetPods, memTargetPeers, benchRSSPodsEnvVar, benchRSSPeersEnvVar)
	}
	fmt.Fprintf(&w, "  load %s -> %s\n", loadBefore, loadAvg())
	b.ReportMetric(mib(medianBytes(m.idleOne.workingSet)), "MiB-idle-1-peer-working-set")
	b.ReportMetric(mib(medianBytes(m.idleAll.workingSet)), "MiB-idle-all-peers-working-set")
	b.ReportMetric(mib(slices.Max(peaks)), "MiB-peak-working-set")
	b.ReportMetric(0, "ns/op")
	fmt.Fprint(os.Stdout, w.String())
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// metricName is name as a benchmark unit: "working set" -> "working-set".
func metricName(name string) string {
	name, _, _ = strings.Cut(name, " (")
	return strings.ReplaceAll(strings.ToLower(name), " ", "-")
}

func argsNote(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return ", the agent with " + strings.Join(args, " ")
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
func kib(n int64) float64  { return float64(n) / (1 << 10) }

func medianBytes(xs []uint64) uint64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func spreadMiB(xs []uint64) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f (%.1f to %.1f)", mib(medianBytes(xs)), mib(slices.Min(xs)), mib(slices.Max(xs)))
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

// saveHeapProfile writes c's agent's heap profile to dir/name.pb.gz; no
// dir, nothing.
func saveHeapProfile(b *testing.B, c *federation.NodeCluster, dir, name string) {
	b.Helper()
	if dir == "" {
		return
	}
	for file, path := range map[string]string{
		name + ".pb.gz": "/debug/pprof/heap",
		// The goroutines grouped by stack, as text: who started how many.
		name + "-goroutines.txt": "/debug/pprof/goroutine?debug=1",
	} {
		body, err := agentGetRetried(c, path)
		if err != nil {
			b.Fatalf("%s of agent %s: %v", path, c.Name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// agentGetRetried is agentGet tried up to three times: an agent on a
// loaded machine can take longer than agentGet waits once.
func agentGetRetried(c *federation.NodeCluster, path string) (string, error) {
	var err error
	for range 3 {
		var body string
		var status int
		body, status, err = agentGet(c, path)
		if err == nil && status == http.StatusOK {
			return body, nil
		}
		if err == nil {
			err = fmt.Errorf("GET %s: status %d: %s", path, status, body)
		}
	}
	return "", err
}

// runtimeMetrics are the unlabelled metrics, by name, of c's agent replica on node.
func runtimeMetrics(c *federation.NodeCluster, node *harness.Node) (map[string]uint64, error) {
	body, status, err := agentGetOn(c, node, "/metrics")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: status %d", status)
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

// startSwarm runs n swarm members on a new site of c's LAN, joined to
// c's agent's gossip on hub (its active gateway node's address) with the
// federation key.
func startSwarm(b *testing.B, env *harness.Env, c *federation.NodeCluster, hub netip.Addr, n int) {
	b.Helper()
	site := env.NewSite("swarm", harness.SiteOptions{LAN: c.LAN()})
	cfg, err := json.Marshal(swarmConfig{
		Token:     c.FederationToken(),
		Advertise: site.Addr, GossipPort: swarmGossipPort, WireGuardPort: swarmWireGuardPort,
		Hub: netip.AddrPortFrom(hub, 7946), Peers: n,
		Network: netip.MustParsePrefix("10.0.0.0/20"), Dir: filepath.Join(env.Dir, "swarm"),
	})
	if err != nil {
		b.Fatal(err)
	}
	// In a file, not on the command line: it holds the federation key.
	site.Start("swarm", os.Args[0], "swarm", env.WriteFile("swarm.json", cfg))
}

// waitPeersConnected waits until c has n Peers, all Connected.
func waitPeersConnected(b *testing.B, c *federation.NodeCluster, n int, timeout time.Duration) {
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
		if time.Now().After(deadline) {
			b.Fatalf("%s has %d of %d Peers Connected after %s (err %v); by phase: %v", c.Name, connected, n, timeout, err, phases)
		}
		time.Sleep(time.Second)
	}
}

// offloadRemote offloads namespace ns of cons to prov with its pods
// Remote, waits until it is Ready and the virtual node of prov is Ready,
// and returns cons's view of prov's pod network.
func offloadRemote(b *testing.B, cons, prov *federation.NodeCluster, ns string) netip.Prefix {
	b.Helper()
	ctx := context.Background()
	if _, err := cons.CP.Client.CoreV1().Namespaces().Create(ctx, offloadedNamespace(ns), metav1.CreateOptions{}); err != nil {
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
	// As an admin does it: the provider alone (the swarm's members grant
	// nothing), by a label of the admin's on its Peer, and the RoleBinding
	// that lets reflection read ns.
	mustKubectl(b, cons.CP, "label", "peer", p.Name, "bench=provider")
	if out, err := flotillaCLI(b, cons, "offload", "namespace", ns, "--selector", "bench=provider", "--pods", "Remote", "--wait", "0"); err != nil {
		b.Fatalf("flotilla offload namespace %s: %v\n%s", ns, err, out)
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
			b.Fatalf("namespace %s offloaded to %s not Ready with its virtual node after 2 minutes: %v %q (%+v), node %v", ns, prov.Name, err, got.Status.Phase, got.Status, nerr)
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
				Spec:       *harness.Restricted(&corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}}),
			},
		},
	}
	if _, err := c.CP.Client.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// waitReflected waits until n pods app=name in ns of c are Running with
// an address in view (the provider's pods as c sees them).
func waitReflected(b *testing.B, c *federation.NodeCluster, ns, name string, n int, view netip.Prefix, timeout time.Duration) {
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
		if time.Now().After(deadline) {
			_, aerr := c.AgentPod(context.Background())
			b.Fatalf("%d of %d pods app=%s Running in %s on %s with an address in %s after %s (err %v); the agent: %v", running, n, name, ns, c.Name, view, timeout, err, aerr)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// deleteAndWaitGone deletes Deployment name and waits until its pods are
// gone from c (each waits for its pod on the provider to go first).
func deleteAndWaitGone(b *testing.B, c *federation.NodeCluster, ns, name string, timeout time.Duration) {
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
