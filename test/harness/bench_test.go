package harness_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-io/flotilla/test/harness"
)

// reportMedian reports the median, min and max of samples in milliseconds.
func reportMedian(b *testing.B, samples []time.Duration) {
	b.Helper()
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(samples[len(samples)/2]), "ms-median")
	b.ReportMetric(ms(samples[0]), "ms-min")
	b.ReportMetric(ms(samples[len(samples)-1]), "ms-max")
	b.ReportMetric(0, "ns/op") // the wall time of the loop says nothing here
}

// Time from nothing to a control plane whose API server is ready and whose
// controller manager has created the default ServiceAccount.
func BenchmarkControlPlaneStart(b *testing.B) {
	harness.Require(b, harness.NeedsControlPlane...)
	env := harness.New(b)
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		cp := env.ControlPlane(fmt.Sprintf("cp%d", i), harness.ControlPlaneOptions{})
		samples = append(samples, time.Since(start))
		cp.Stop()
	}
	reportMedian(b, samples)
}

// Time to create a site on a LAN and one pod behind it.
func BenchmarkSiteAndPod(b *testing.B) {
	harness.Require(b, harness.NeedsNetwork...)
	env := harness.New(b)
	lan := env.NewLAN("lan")
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		s := env.NewSite(fmt.Sprintf("s%d", i), harness.SiteOptions{LAN: lan, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
		s.AddPod("p", netip.MustParseAddr("10.0.0.5"))
		samples = append(samples, time.Since(start))
	}
	reportMedian(b, samples)
}

// Time from nothing to the first Ready pod of a cluster of three real
// nodes: the control plane, then the three nodes at once, then one test
// server pod. Also reported: when the nodes were Ready (from the start and
// from the control plane's being ready), how long the pod
// took from its creation, the memory of the cluster with its pod, and the
// time to tear the whole cluster down (pods, nodes, control plane, mounts,
// cgroups, namespaces).
func BenchmarkRealClusterFirstPod(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	// Built once, outside the measured loop.
	harness.ImageTarball(b, harness.PauseImage)
	harness.ImageTarball(b, harness.TestServerImage)
	var firstPod, nodesReady, nodesAfterCP, podReady, teardown []time.Duration
	var memory, nodeMemory []int64
	for b.Loop() {
		var start, down time.Time
		var log strings.Builder
		code := harness.RunProgram(b.Name(), &log, func(p *harness.Program) {
			start = time.Now()
			env := harness.New(p)
			cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
			cpUp := time.Now()
			nodes := cp.StartNodes(harness.NodeOptions{}, "gw", "w1", "w2")
			nodesReady = append(nodesReady, time.Since(start))
			nodesAfterCP = append(nodesAfterCP, time.Since(cpUp))
			created := time.Now()
			if err := runTestServerPod(cp, "web"); err != nil {
				p.Fatalf("%v", err)
			}
			firstPod = append(firstPod, time.Since(start))
			podReady = append(podReady, time.Since(created))
			bytes := cp.Memory()
			for _, n := range nodes {
				nodeMemory = append(nodeMemory, n.Memory())
				bytes += nodeMemory[len(nodeMemory)-1]
			}
			memory = append(memory, bytes)
			down = time.Now()
		})
		if code != 0 {
			b.Fatalf("cluster failed:\n%s", log.String())
		}
		teardown = append(teardown, time.Since(down))
	}
	reportMedian(b, firstPod)
	reportMedianAs(b, nodesReady, "ms-nodes-ready")
	reportMedianAs(b, nodesAfterCP, "ms-nodes-after-cp")
	reportMedianAs(b, podReady, "ms-pod-ready")
	reportMedianAs(b, teardown, "ms-teardown")
	slices.Sort(memory)
	b.ReportMetric(float64(memory[len(memory)/2])/(1<<20), "MiB-cluster")
	slices.Sort(nodeMemory)
	b.ReportMetric(float64(nodeMemory[len(nodeMemory)/2])/(1<<20), "MiB-node")
}

// Four clusters of three real nodes each (a gateway and two workers),
// started at once on this machine, to the moment all four have a Ready
// pod; also each cluster's own time to its first pod: what the
// federation tests that need several clusters pay to start.
func BenchmarkRealClustersAtOnce(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	harness.ImageTarball(b, harness.PauseImage)
	harness.ImageTarball(b, harness.TestServerImage)
	const clusters = 4
	var allReady, eachReady []time.Duration
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failures []string
		var round []time.Duration
		for i := range clusters {
			wg.Go(func() {
				var log strings.Builder
				code := harness.RunProgram(fmt.Sprintf("%s-%d", b.Name(), i), &log, func(p *harness.Program) {
					env := harness.New(p)
					cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
					cp.StartNodes(harness.NodeOptions{}, "gw", "w1", "w2")
					if err := runTestServerPod(cp, "web"); err != nil {
						p.Fatalf("%v", err)
					}
					mu.Lock()
					round = append(round, time.Since(start))
					mu.Unlock()
				})
				if code != 0 {
					mu.Lock()
					failures = append(failures, log.String())
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(failures) > 0 {
			b.Fatalf("%d of %d clusters failed:\n%s", len(failures), clusters, strings.Join(failures, "\n---\n"))
		}
		allReady = append(allReady, slices.Max(round))
		eachReady = append(eachReady, round...)
	}
	reportMedian(b, allReady)
	reportMedianAs(b, eachReady, "ms-each-cluster")
}

// reportMedianAs reports only the median of samples, in milliseconds.
func reportMedianAs(b *testing.B, samples []time.Duration, unit string) {
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, unit)
}

// runTestServerPod creates a test server pod and waits until it is Ready.
func runTestServerPod(cp *harness.ControlPlane, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "server", Image: harness.TestServerImage, ImagePullPolicy: corev1.PullNever,
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(harness.TestServerTCPPort)}},
				PeriodSeconds: 1,
			},
		}}},
	}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}
