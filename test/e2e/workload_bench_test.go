package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// benchPodsEnvVar sets how many pods BenchmarkOffloadedPodStartup starts
// per round (default 10): as many as one real node of this machine runs
// at once without measuring the machine's limits rather than Flotilla.
const benchPodsEnvVar = "FLOTILLA_BENCH_STARTUP_PODS"

// Offloaded pod startup on real kubelets, as a ratio to the same pods
// started directly on the provider, in the same run. Two clusters of real
// nodes; a's namespace is offloaded to b with its pods Remote. Each round
// starts a Deployment of N pods directly in a namespace of b, timed from
// its creation until all are Ready on b, and the same Deployment in a's
// offloaded namespace, timed until all are Ready on a (the scheduler of
// a, the agent's reflection, b's scheduler and kubelet, the status back);
// the order alternates between rounds, and both are deleted and gone
// before the next. Target: ratio <= 1.2.
func BenchmarkOffloadedPodStartup(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	pods := 10
	if v := os.Getenv(benchPodsEnvVar); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive number of pods", benchPodsEnvVar, v)
		}
		pods = n
	}
	cons, prov := grantedPair(b)
	for _, c := range []*federation.NodeCluster{cons, prov} {
		if _, err := c.CP.Client.CoreV1().Namespaces().Create(context.Background(), namespaceNamed("bench"), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if out, err := flotillaCLI(b, cons, "offload", "namespace", "bench", "--selector", everyPeer, "--pods", "Remote"); err != nil {
		b.Fatalf("flotilla offload namespace bench: %v\n%s", err, out)
	}
	startup := func(c *federation.NodeCluster, name string) time.Duration {
		start := time.Now()
		federation.CreateDeployment(b, c, "bench", name, int32(pods), nil)
		federation.WaitDeployment(b, c, "bench", name, pods, 3*time.Minute)
		took := time.Since(start)
		if err := c.CP.Client.AppsV1().Deployments("bench").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		federation.WaitDeployment(b, c, "bench", name, 0, 3*time.Minute)
		return took
	}
	var direct, offloaded, ratios []time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("web-%d", i)
		var d, o time.Duration
		if i%2 == 0 {
			d, o = startup(prov, name), startup(cons, name)
		} else {
			o, d = startup(cons, name), startup(prov, name)
		}
		direct, offloaded = append(direct, d), append(offloaded, o)
		// A ratio as a Duration of milli-units, to reuse spreadOf.
		ratios = append(ratios, time.Duration(float64(o)/float64(d)*1000))
		fmt.Fprintf(os.Stdout, "round %d: %d pods Ready directly on %s in %.0f ms, offloaded from %s in %.0f ms\n", i+1, pods, prov.Name, ms(d), cons.Name, ms(o))
	}
	r := spreadOf(ratios)
	b.ReportMetric(float64(r.median)/1000, "ratio-median")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkOffloadedPodStartup: %d pods on real kubelets; ms: median, min, max, rounds\n  directly on the provider %s\n  offloaded               %s\n  ratio offloaded/direct  %.2f (%.2f to %.2f)\n",
		pods, spreadOf(direct), spreadOf(offloaded), float64(r.median)/1000, float64(r.min)/1000, float64(r.max)/1000)
}
