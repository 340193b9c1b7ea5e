package mirror_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/test/harness"
)

// From creating a NamespaceOffload to its phase Ready, one provider, with
// both sides' controllers in this process on real control planes and
// every API request they make recorded (harness.Trace): how many of each
// verb and resource each side made until Ready, how many of them one
// after another (the sequential depth), and, for the first round, the
// timeline of requests and watch data, which shows what waits for what.
// The request counts and the depth do not depend on the machine's load;
// the time does (the end-to-end figure is BenchmarkNamespaceOffload in
// test/e2e).
func BenchmarkNamespaceOffloadRoundTrips(b *testing.B) {
	tr := harness.NewTrace()
	e := offloadenv.NewPodEnv(b, offloadenv.PodEnvOptions{Trace: tr})
	e.OffloadReady(b, "warm") // sessions, watches and caches started
	ctx := context.Background()
	var rounds harness.Rounds
	for i := 0; b.Loop(); i++ {
		ns := fmt.Sprintf("bench-%d", i)
		if err := e.LocalAdmin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		tr.WaitQuiet()
		tr.Reset()
		start := time.Now()
		nso := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"},
			Spec: v1alpha1.NamespaceOffloadSpec{ClusterSelector: offloadenv.EveryProvider()}}
		if err := e.LocalAdmin.Create(ctx, nso); err != nil {
			b.Fatal(err)
		}
		waitReady(b, e.LocalAdmin, ns)
		rounds.Add(tr, time.Since(start))
		if i == 0 {
			tr.Report(os.Stdout, "BenchmarkNamespaceOffloadRoundTrips: requests until Ready, first round")
			tr.WaitQuiet()
			tr.Report(os.Stdout, "BenchmarkNamespaceOffloadRoundTrips: every request of the first round, until none came for 200 ms")
		}
	}
	rounds.Report(os.Stdout, b, "BenchmarkNamespaceOffloadRoundTrips")
}

// waitReady polls, untraced, until the NamespaceOffload of ns is Ready
// for the spec it holds.
func waitReady(b *testing.B, admin client.Client, ns string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var o v1alpha1.NamespaceOffload
		err := admin.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "offload"}, &o)
		if err == nil && o.Status.Phase == v1alpha1.OffloadReady && o.Status.ObservedGeneration == o.Generation {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("NamespaceOffload of %s not Ready after 30s: %s (err %v)", ns, offloadenv.DescribeOffload(&o), err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
