package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// benchProvidersEnvVar overrides the provider counts of
// BenchmarkNamespaceOffloadScale: FLOTILLA_BENCH_PROVIDERS=1,5.
const benchProvidersEnvVar = "FLOTILLA_BENCH_PROVIDERS"

// scaleNamespaces are offloaded at once in every round.
const scaleNamespaces = 100

// scaleClusterMiB is what one cluster of the benchmark takes: a control
// plane without nodes (etcd, kube-apiserver, kube-controller-manager) and
// its agent process; about 300 MiB measured with 100 namespaces
// offloaded (docs/benchmarks.md), with room to spare.
const scaleClusterMiB = 400

// scalePerPair is the time per namespace-provider pair of providers=1, to
// print each larger size's growth against it.
var scalePerPair struct {
	sync.Mutex
	one time.Duration
}

// 100 namespaces offloaded at once to 1, 5, 10 and 20 providers: from
// creating the 100 NamespaceOffloads (a selector of every Peer)
// to all of them Ready, and each one's own time to Ready. Each cluster is
// a control plane without nodes and its agent as a process on a site: the
// flow is API server to API server, so nodes and the data path add
// nothing but load (every agent runs --peering=manual: no tunnels). The
// work is 100 x providers requests, so the time should grow linearly:
// the figure per namespace-provider pair stays flat.
func BenchmarkNamespaceOffloadScale(b *testing.B) {
	for _, n := range benchProviders(b) {
		b.Run(fmt.Sprintf("providers=%d", n), func(b *testing.B) { benchOffloadScale(b, n) })
	}
}

func benchProviders(b *testing.B) []int {
	s := os.Getenv(benchProvidersEnvVar)
	if s == "" {
		return []int{1, 5, 10, 20}
	}
	var ns []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 25 {
			b.Fatalf("%s=%q: want provider counts from 1 to 25, comma-separated (1,5)", benchProvidersEnvVar, s)
		}
		ns = append(ns, n)
	}
	return ns
}

func benchOffloadScale(b *testing.B, providers int) {
	requireAll(b)
	requireMemory(b, providers+1)
	loadBefore := loadAvg()
	env := harness.New(b)
	cidrs := make([]string, providers+1)
	for i := range cidrs {
		cidrs[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	cs := federation.New(b, env, federation.Options{
		PodCIDRs: cidrs,
		Args:     []string{"--peering", "manual", "--log-level", "info"},
		ArgsFor: func(i int, _ []*federation.Cluster) []string {
			if i == 0 {
				return []string{"--offload-to=auto"} // the consumer grants nothing, uses every grant
			}
			return []string{"--offload-grants=auto"}
		},
	})
	// Each agent runs as deploy/'s account, with its RBAC (the
	// providers' ClusterRole flotilla-consumer, which the RoleBindings of
	// each tenant and mirrored namespace name) and admission policies (a
	// provider grants nothing before it proves they confine it).
	for _, c := range cs {
		c.RunAsAgentAccount(b)
	}
	started := time.Now()
	for _, c := range cs {
		c.StartAgent(b)
	}
	cons := cs[0]
	waitCredentials(b, cons, cs[1:], 5*time.Minute)
	// Each provider's admin lets the consumer mirror every namespace of a
	// round (the default is 50).
	limit := int64(scaleNamespaces)
	for _, p := range cs[1:] {
		changePeerSpec(b, p, cons.Name, func(s *v1alpha1.PeerSpec) {
			s.OffloadLimits = &v1alpha1.OffloadLimits{Namespaces: &limit}
		})
	}
	fmt.Fprintf(os.Stdout, "providers=%d: %d clusters up and every credential Ready on the consumer in %.1f s\n", providers, len(cs), time.Since(started).Seconds())

	cfg := rest.CopyConfig(cons.CP.Config)
	cfg.QPS, cfg.Burst = -1, 0 // the benchmark's own writes are not throttled
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cl, err := client.NewWithWatch(cfg, client.Options{Scheme: peerapi.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	var each []time.Duration
	var prev []string
	for round := 0; b.Loop(); round++ {
		if prev != nil {
			// The next round starts from nothing; one round (-benchtime
			// 1x) leaves the teardown to the harness.
			b.StopTimer()
			unoffloadAll(b, kube, cl, prev, 10*time.Minute)
			b.StartTimer()
		}
		names := make([]string, scaleNamespaces)
		for i := range names {
			names[i] = fmt.Sprintf("scale-%d-%03d", round, i)
		}
		for _, ns := range names {
			if _, err := kube.CoreV1().Namespaces().Create(context.Background(), namespaceNamed(ns), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		idle := idleCost(cs)
		before := costNow(cs)
		t, e := offloadAtOnce(b, cl, names, providers)
		printCost(providers, idle, before, costNow(cs))
		total += t
		each = append(each, e...)
		prev = names
	}
	rounds := len(each) / scaleNamespaces
	meanTotal := total / time.Duration(rounds)
	perPair := meanTotal / time.Duration(scaleNamespaces*providers)
	s := spreadOf(each)
	b.ReportMetric(ms(meanTotal), "ms-all-ready")
	b.ReportMetric(ms(s.median), "ms-per-ns-median")
	b.ReportMetric(ms(perPair), "ms-per-ns-provider")
	b.ReportMetric(0, "ns/op")

	ratio := "-"
	scalePerPair.Lock()
	if providers == 1 {
		scalePerPair.one = perPair
	}
	if one := scalePerPair.one; one > 0 {
		ratio = fmt.Sprintf("%.2f", float64(perPair)/float64(one))
	}
	scalePerPair.Unlock()
	fmt.Fprintf(os.Stdout, "BenchmarkNamespaceOffloadScale providers=%d: %d namespaces at once, all Ready in %.0f ms; each to Ready %.0f ms median (%.0f to %.0f); %.1f ms per namespace-provider pair, %s x that of providers=1; %d rounds; load %s -> %s; memory used %d MiB\n",
		providers, scaleNamespaces, ms(meanTotal), ms(s.median), ms(s.min), ms(s.max), ms(perPair), ratio, rounds, loadBefore, loadAvg(), memUsedMiB())
}

// offloadAtOnce creates a NamespaceOffload in each of names (existing
// namespaces) all at once and waits, on a watch as `flotilla offload
// namespace --wait` does, until every one is Ready with every provider
// in its status; it returns the time until the last was Ready and each
// one's time from its own creation.
func offloadAtOnce(b *testing.B, cl client.WithWatch, names []string, providers int) (time.Duration, []time.Duration) {
	b.Helper()
	ctx := context.Background()
	// The watch starts before the first creation: no Ready is missed.
	w := watchOffloads(b, cl)
	defer func() { w.Stop() }()
	created := make([]time.Time, len(names))
	index := map[string]int{}
	for i, ns := range names {
		index[ns] = i
	}
	errs := make(chan error, len(names))
	start := time.Now()
	var wg sync.WaitGroup
	for i, ns := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created[i] = time.Now()
			nso := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"},
				Spec: v1alpha1.NamespaceOffloadSpec{ClusterSelector: everyPeerSelector()}}
			if err := cl.Create(ctx, nso); err != nil {
				errs <- fmt.Errorf("create the NamespaceOffload in %s: %w", ns, err)
			}
		}()
	}
	ready := make([]time.Time, len(names))
	left := len(names)
	last := map[string]*v1alpha1.NamespaceOffload{}
	timeout := time.After(5*time.Minute + time.Duration(providers)*15*time.Second)
	for left > 0 {
		select {
		case err := <-errs:
			b.Fatal(err)
		case <-timeout:
			var stuck []string
			for ns, i := range index {
				if ready[i].IsZero() {
					stuck = append(stuck, describeOffload(ns, last[ns]))
				}
			}
			slices.Sort(stuck)
			b.Fatalf("%d of %d NamespaceOffloads not Ready:\n  %s", left, len(names), strings.Join(stuck[:min(len(stuck), 10)], "\n  "))
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The API server ends watches of a CRD whose definition
				// changed (the agent installs its CRDs at start); the new
				// one starts with every object as it is.
				w = watchOffloads(b, cl)
				continue
			}
			if ev.Type == watch.Error {
				b.Fatalf("the watch of NamespaceOffloads: %v", ev.Object)
			}
			o, isOffload := ev.Object.(*v1alpha1.NamespaceOffload)
			if !isOffload {
				continue
			}
			i, ours := index[o.Namespace]
			if !ours || !ready[i].IsZero() {
				continue
			}
			last[o.Namespace] = o
			if offloadReady(o, providers) {
				ready[i] = time.Now()
				left--
			}
		}
	}
	wg.Wait()
	each := make([]time.Duration, len(names))
	var all time.Duration
	for i := range names {
		each[i] = ready[i].Sub(created[i])
		all = max(all, ready[i].Sub(start))
	}
	return all, each
}

// watchOffloads watches NamespaceOffloads from resource version 0: what
// the API server's watch cache holds, every object as an event first.
// Without it the server waits for its cache to reach etcd's latest
// version, which a resource without writes may not within the 3 s it
// allows (504, "Too large resource version").
func watchOffloads(b *testing.B, cl client.WithWatch) watch.Interface {
	b.Helper()
	w, err := cl.Watch(context.Background(), &v1alpha1.NamespaceOffloadList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// offloadReady: phase Ready for this generation, with every provider.
func offloadReady(o *v1alpha1.NamespaceOffload, providers int) bool {
	if o.Status.Phase != v1alpha1.OffloadReady || o.Status.ObservedGeneration != o.Generation || len(o.Status.Clusters) != providers {
		return false
	}
	for _, c := range o.Status.Clusters {
		if !meta.IsStatusConditionTrue(c.Conditions, "Ready") {
			return false
		}
	}
	return true
}

func describeOffload(ns string, o *v1alpha1.NamespaceOffload) string {
	if o == nil {
		return ns + ": no event seen"
	}
	reasons := map[string]int{}
	for _, c := range o.Status.Clusters {
		if r := meta.FindStatusCondition(c.Conditions, "Ready"); r != nil {
			reasons[r.Reason]++
		}
	}
	return fmt.Sprintf("%s: phase %q, generation %d/%d, clusters by reason %v", ns, o.Status.Phase, o.Status.ObservedGeneration, o.Generation, reasons)
}

// unoffloadAll deletes the round's NamespaceOffloads and namespaces and
// waits until the NamespaceOffloads are gone (their providers removed
// the remote namespaces), so the next round starts from nothing.
func unoffloadAll(b *testing.B, kube kubernetes.Interface, cl client.Client, names []string, timeout time.Duration) {
	b.Helper()
	ctx := context.Background()
	for _, ns := range names {
		nso := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"}}
		if err := client.IgnoreNotFound(cl.Delete(ctx, nso)); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		var list v1alpha1.NamespaceOffloadList
		err := cl.List(ctx, &list)
		if err == nil && len(list.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d NamespaceOffloads not gone after %s (err %v)", len(list.Items), timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, ns := range names {
		if err := kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// waitCredentials waits until the consumer holds a Ready credential from
// every provider.
func waitCredentials(b *testing.B, cons *federation.Cluster, providers []*federation.Cluster, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var missing []string
		peers, err := cons.Peers(context.Background())
		for _, p := range providers {
			if exited, xerr := p.Agent.Exited(); exited {
				b.Fatalf("agent of %s exited: %v\n%s", p.Name, xerr, p.Agent.Tail(30))
			}
			c := meta.FindStatusCondition(peers[p.Name].Status.Conditions, v1alpha1.ConditionOffloadCredential)
			if c == nil || c.Reason != "Ready" {
				missing = append(missing, fmt.Sprintf("%s: %+v", p.Name, c))
			}
		}
		if err == nil && len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the consumer has no Ready credential from %d of %d providers after %s (err %v):\n  %s",
				len(missing), len(providers), timeout, err, strings.Join(missing[:min(len(missing), 10)], "\n  "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireMemory skips (fails under CI=true) a size whose clusters do not
// fit in the memory available.
func requireMemory(b *testing.B, clusters int) {
	b.Helper()
	need := clusters * scaleClusterMiB
	have := memAvailableMiB()
	if have >= need {
		return
	}
	msg := fmt.Sprintf("%d clusters need about %d MiB (%d each), %d MiB available", clusters, need, scaleClusterMiB, have)
	if os.Getenv("CI") == "true" {
		b.Fatal(msg)
	}
	fmt.Fprintf(os.Stdout, "%s: skipped: %s\n", b.Name(), msg)
	b.Skip(msg)
}

// memAvailableMiB reads MemAvailable from /proc/meminfo (0 if unknown).
func memAvailableMiB() int { return meminfo("MemAvailable") }

func memUsedMiB() int { return meminfo("MemTotal") - meminfo("MemAvailable") }

func meminfo(key string) int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == key+":" {
			kb, _ := strconv.Atoi(fields[1])
			return kb / 1024
		}
	}
	return 0
}

// loadAvg is the 1-minute load average: other work on the machine skews
// the figures.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
