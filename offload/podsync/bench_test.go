package podsync

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/test/harness"
)

// BenchmarkPodOffload: from creating a Deployment on the consumer (its
// template tolerates the virtual node and selects it, as the placement
// webhook would make it) to all its pods Running on the consumer with
// the provider pods' IPs translated into its view. Both clusters are real
// control planes with their schedulers and controller managers (client
// limits raised: theirs would hold a thousand pods to a minute); the
// provider's nodes are the harness's stand-in kubelets, the consumer's
// virtual node a Node kept Ready. Sizes: FLOTILLA_BENCH_PODS (default
// 100,1000); rounds: -benchtime Nx. It prints per size the median, min
// and max, when the consumer had bound every pod, each pod's time from
// its binding to Running here in three steps, the reflection lag metric,
// and, in the first round, the heap the reflector holds with every pod
// offloaded and the time a restarted reflector takes to reconcile them.
// FLOTILLA_BENCH_POD_WORKERS sets the reflector's workers.
//
//	go test ./offload -run '^$' -bench PodOffload -benchtime 5x
func BenchmarkPodOffload(b *testing.B) {
	sizes := []int{100, 1000}
	if s := os.Getenv("FLOTILLA_BENCH_PODS"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("FLOTILLA_BENCH_PODS=%q: want sizes like 100,1000", s)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { benchmarkPodOffload(b, n) })
	}
}

func benchmarkPodOffload(b *testing.B, pods int) {
	// 250 pods a node at most; each stand-in kubelet writes its pods'
	// status one after the other, as a real one is one of many nodes.
	kubelets := min(pods/100+2, 16)
	e := newPodsEnv(b, offloadenv.PodEnvOptions{Kubelets: kubelets, Consumer: harness.ControlPlaneOptions{Scheduler: true}, ClientQPS: 1000})
	workers, _ := strconv.Atoi(os.Getenv("FLOTILLA_BENCH_POD_WORKERS"))
	e.startReflector(b, workers, false)
	remoteNS := e.OffloadReady(b, "bench")
	watch := watchBenchPods(b, e, remoteNS)

	var total, bound, tail, perPod, toCreated, toRunningThere, toRunningHere []time.Duration
	for round := 0; b.Loop(); round++ {
		app := fmt.Sprintf("bench-%d", round)
		lags := map[string]*dto.Histogram{lagPod: e.lagHistogram(b, lagPod), lagPodStatus: e.lagHistogram(b, lagPodStatus)}
		start := time.Now()
		if _, err := e.Local.Client.AppsV1().Deployments("bench").Create(b.Context(), benchDeployment(app, e.Provider.ID, pods), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		r := watch.wait(b, app, pods)
		total = append(total, r.running.Sub(start))
		bound = append(bound, r.bound.Sub(start))
		tail = append(tail, r.running.Sub(r.bound))
		perPod = append(perPod, r.perPod...)
		toCreated = append(toCreated, r.toCreated...)
		toRunningThere = append(toRunningThere, r.toRunningThere...)
		toRunningHere = append(toRunningHere, r.toRunningHere...)
		// One line a round: benchmarks keep ten lines of log.
		b.Logf("round %d: %v (all bound here after %v, the last Running here %v later); a pod from binding to Running here %s: to its creation there %s, then Running there %s, then Running here %s; lag metric, pod %s, podstatus %s",
			round+1, r.running.Sub(start).Round(time.Millisecond), r.bound.Sub(start).Round(time.Millisecond),
			r.running.Sub(r.bound).Round(time.Millisecond), spread(r.perPod), spread(r.toCreated), spread(r.toRunningThere), spread(r.toRunningHere),
			e.lagSince(b, lagPod, lags[lagPod]), e.lagSince(b, lagPodStatus, lags[lagPodStatus]))
		b.StopTimer()
		if round == 0 {
			e.reportReflectorHeap(b, pods, remoteNS)
		}
		e.removeDeployment(b, app, remoteNS)
		b.StartTimer()
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	slices.Sort(total)
	b.ReportMetric(ms(harness.Median(total)), "ms-median")
	b.ReportMetric(ms(total[0]), "ms-min")
	b.ReportMetric(ms(total[len(total)-1]), "ms-max")
	b.ReportMetric(ms(harness.Median(bound)), "ms-bound-median")
	b.ReportMetric(ms(harness.Median(tail)), "ms-after-bound-median")
	b.ReportMetric(ms(harness.Median(perPod)), "ms-pod-median")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d pods, %d rounds: all Running here %v median (%v to %v); all bound by the consumer %v median; the last pod Running %v after the last binding (median); a pod from binding to Running here %s: to its creation there %s, then Running there %s, then Running here %s",
		pods, len(total), harness.Median(total).Round(time.Millisecond), total[0].Round(time.Millisecond), total[len(total)-1].Round(time.Millisecond),
		harness.Median(bound).Round(time.Millisecond), harness.Median(tail).Round(time.Millisecond), spread(perPod), spread(toCreated), spread(toRunningThere), spread(toRunningHere))
}

// spread is the median and the maximum of ds.
func spread(ds []time.Duration) string {
	return fmt.Sprintf("%v median, %v max", harness.Median(ds).Round(time.Millisecond), slices.Max(ds).Round(time.Millisecond))
}

// benchDeployment is what the placement webhook makes of a Deployment in
// a Remote namespace: its pods tolerate virtual nodes and go to
// provider's.
func benchDeployment(app, provider string, replicas int) *appsv1.Deployment {
	n := int32(replicas)
	sel := map[string]string{"app": app}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: app},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: *harness.Restricted(&corev1.PodSpec{
					NodeSelector: map[string]string{offload.LabelClusterID: provider},
					Tolerations:  []corev1.Toleration{{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
					Containers:   []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
				}),
			},
		},
	}
}

// benchWatch follows the pods of namespace bench on both sides: when
// each was first seen bound here, created on the provider, Running there,
// and Running here with an address in the consumer's view of the
// provider and the virtual node as host.
type benchWatch struct {
	mu      sync.Mutex
	pods    map[string]*podTimeline // by pod name
	changed chan struct{}
}

type podTimeline struct {
	app                                       string
	bound, created, runningThere, runningHere time.Time
}

func watchBenchPods(b *testing.B, e *podsEnv, remoteNS string) *benchWatch {
	w := &benchWatch{pods: map[string]*podTimeline{}, changed: make(chan struct{}, 1)}
	see := func(here bool) func(obj any) {
		return func(obj any) {
			p, ok := podOf(obj)
			if !ok {
				return
			}
			now := time.Now()
			w.mu.Lock()
			tl := w.pods[p.Name]
			if tl == nil {
				tl = &podTimeline{app: p.Labels["app"]}
				w.pods[p.Name] = tl
			}
			set := func(t *time.Time, ok bool) {
				if ok && t.IsZero() {
					*t = now
				}
			}
			if here {
				set(&tl.bound, p.Spec.NodeName != "")
				set(&tl.runningHere, reflectedHere(p))
			} else {
				set(&tl.created, true)
				set(&tl.runningThere, p.Status.Phase == corev1.PodRunning)
			}
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}
	gone := func(obj any) {
		if p, ok := podOf(obj); ok {
			w.mu.Lock()
			delete(w.pods, p.Name)
			w.mu.Unlock()
		}
	}
	for _, side := range []struct {
		here   bool
		client kubernetes.Interface
		ns     string
	}{{true, e.Local.Client, "bench"}, {false, e.Provider.CP.Client, remoteNS}} {
		factory := informers.NewSharedInformerFactoryWithOptions(side.client, 0, informers.WithNamespace(side.ns))
		inf := factory.Core().V1().Pods().Informer()
		handlers := toolscache.ResourceEventHandlerFuncs{AddFunc: see(side.here), UpdateFunc: func(_, obj any) { see(side.here)(obj) }}
		if side.here {
			handlers.DeleteFunc = gone // the provider's pods go first
		}
		if _, err := inf.AddEventHandler(handlers); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		factory.Start(ctx.Done())
		b.Cleanup(func() { cancel(); factory.Shutdown() })
		if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			b.Fatal("the benchmark's pod informer did not sync")
		}
	}
	return w
}

// reflectedHere reports whether p shows a pod running on the provider:
// Running, its IP in the consumer's view of the provider's pods, its host
// the virtual node.
func reflectedHere(p *corev1.Pod) bool {
	ip, err := netip.ParseAddr(p.Status.PodIP)
	return p.Status.Phase == corev1.PodRunning && err == nil && offloadtest.ViewOfProviderPods.Contains(ip) && p.Status.HostIP == offloadtest.VirtualNodeAddress.String()
}

// benchResult is one round: when the last pod was bound here and Running
// here, and each pod's steps.
type benchResult struct {
	bound, running time.Time
	// From its binding here to its creation there (the reflector), from
	// then to Running there (the provider's scheduler and kubelet), from
	// then to Running here (the reflector), and the whole.
	toCreated, toRunningThere, toRunningHere, perPod []time.Duration
}

// wait waits until n pods of app are Running here.
func (w *benchWatch) wait(b *testing.B, app string, n int) benchResult {
	deadline := time.After(10 * time.Minute)
	for {
		w.mu.Lock()
		var r benchResult
		count := 0
		for _, tl := range w.pods {
			if tl.app != app || tl.runningHere.IsZero() {
				continue
			}
			count++
			r.perPod = append(r.perPod, tl.runningHere.Sub(tl.bound))
			r.toCreated = append(r.toCreated, tl.created.Sub(tl.bound))
			r.toRunningThere = append(r.toRunningThere, tl.runningThere.Sub(tl.created))
			r.toRunningHere = append(r.toRunningHere, tl.runningHere.Sub(tl.runningThere))
			if tl.bound.After(r.bound) {
				r.bound = tl.bound
			}
			if tl.runningHere.After(r.running) {
				r.running = tl.runningHere
			}
		}
		w.mu.Unlock()
		if count >= n {
			return r
		}
		select {
		case <-w.changed:
		case <-deadline:
			b.Fatalf("%d of %d pods of %s Running here after 10 minutes", count, n, app)
		}
	}
}

// reportReflectorHeap prints the heap the running reflector holds with
// every pod offloaded: the Go heap in use with it running, less the same
// once it stopped (both after a collection); the process's RSS likewise,
// after returning freed memory to the system. Everything else in the
// process (the harness's kubelets and clients) holds the same in both.
// A new reflector then takes over, reconciling from both API servers: it
// must replace none of the provider's pods.
func (e *podsEnv) reportReflectorHeap(b *testing.B, pods int, remoteNS string) {
	heap := func() (uint64, uint64) {
		runtime.GC()
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse, rssBytes(b)
	}
	withHeap, withRSS := heap()
	before := uidsOf(e.remotePods(b, remoteNS))
	e.stopReflector()
	withoutHeap, withoutRSS := heap()
	mib := func(with, without uint64) float64 { return (float64(with) - float64(without)) / (1 << 20) }
	b.ReportMetric(mib(withHeap, withoutHeap), "MiB-reflector-heap")
	heapMiB, rssMiB := mib(withHeap, withoutHeap), mib(withRSS, withoutRSS)
	start := time.Now()
	workers, _ := strconv.Atoi(os.Getenv("FLOTILLA_BENCH_POD_WORKERS"))
	e.startReflector(b, workers, false)
	// Every pod reconciled from both API servers, nothing written: the
	// queue drains to empty.
	eventually.Within(b, 5*time.Minute, "the restarted reflector settles", func() error {
		pp := e.reflector().provider(e.Provider.ID)
		if pp == nil || !pp.localSynced.Load() {
			return fmt.Errorf("not listed yet")
		}
		if rn := pp.namespace(remoteNS); rn == nil || !rn.synced.Load() {
			return fmt.Errorf("the provider's pods not listed yet")
		}
		if n := e.reflector().queue.Len(); n > 0 {
			return fmt.Errorf("%d pods queued", n)
		}
		return nil
	})
	settled := time.Since(start)
	replaced := 0
	after := uidsOf(e.remotePods(b, remoteNS))
	for name, uid := range before {
		if after[name] != uid {
			replaced++
		}
	}
	if replaced > 0 || len(after) != len(before) {
		b.Errorf("a restarted reflector replaced %d of the provider's %d pods (%d there now)", replaced, len(before), len(after))
	}
	b.Logf("with %d pods offloaded, the reflector holds %.1f MiB of Go heap in use (%.1f MiB of the process's RSS); restarted, it listed both sides and reconciled them in %v, replacing none",
		pods, heapMiB, rssMiB, settled.Round(time.Millisecond))
}

// lagHistogram is the running reflector's flotilla_reflection_lag_seconds
// of kind (empty when it has none).
func (e *podsEnv) lagHistogram(b *testing.B, kind string) *dto.Histogram {
	m := offloadtest.MetricOf(b, e.registry, "flotilla_reflection_lag_seconds", map[string]string{"kind": kind, "peer": e.Provider.ID})
	if m == nil {
		return &dto.Histogram{}
	}
	return m.GetHistogram()
}

// lagSince sums up the lags of kind observed since the histogram before:
// their count, mean and the bucket their median falls in.
func (e *podsEnv) lagSince(b *testing.B, kind string, before *dto.Histogram) string {
	now := e.lagHistogram(b, kind)
	n := now.GetSampleCount() - before.GetSampleCount()
	if n == 0 {
		return "none"
	}
	mean := time.Duration((now.GetSampleSum() - before.GetSampleSum()) / float64(n) * float64(time.Second))
	prev := map[float64]uint64{}
	for _, bk := range before.GetBucket() {
		prev[bk.GetUpperBound()] = bk.GetCumulativeCount()
	}
	medianBound := "above the last bucket"
	for _, bk := range now.GetBucket() {
		if 2*(bk.GetCumulativeCount()-prev[bk.GetUpperBound()]) >= n {
			medianBound = "<= " + time.Duration(bk.GetUpperBound()*float64(time.Second)).String()
			break
		}
	}
	return fmt.Sprintf("%d, mean %v, median %s", n, mean.Round(time.Millisecond), medianBound)
}

// rssBytes is the process's resident set size (/proc/self/status VmRSS).
func rssBytes(b *testing.B) uint64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// removeDeployment deletes app's Deployment and waits until its pods are
// gone from both clusters.
func (e *podsEnv) removeDeployment(b *testing.B, app, remoteNS string) {
	background := metav1.DeletePropagationBackground
	if err := e.Local.Client.AppsV1().Deployments("bench").Delete(b.Context(), app, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		b.Fatal(err)
	}
	sel := labels.Set{"app": app}.String()
	eventually.Within(b, 10*time.Minute, "the pods of "+app+" gone", func() error {
		here, err := e.Local.Client.CoreV1().Pods("bench").List(b.Context(), metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		there, err := e.Provider.CP.Client.CoreV1().Pods(remoteNS).List(b.Context(), metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		if len(here.Items)+len(there.Items) > 0 {
			return fmt.Errorf("%d here, %d on the provider", len(here.Items), len(there.Items))
		}
		return nil
	})
}

// podOf is the pod an informer handed over, a deleted one's last state
// included.
func podOf(obj any) (*corev1.Pod, bool) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	return p, ok
}
