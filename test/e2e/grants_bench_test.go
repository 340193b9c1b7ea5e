package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/busy"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// From the provider's admin setting spec.offloading to Grant to a working
// credential on the consumer: the consumer's Peer says Ready, which its
// agent writes only after a request to the provider's API server with the
// credential succeeded. Two clusters of real nodes, the agents as pods
// under their own accounts. Each round starts from nothing: the previous
// grant revoked and its tenant namespace gone. Target: <= 100 ms median,
// quiet and with both cores kept busy (busy-loops=0 and 2, see
// test/busy); Liqo v1's `liqoctl peer` needs both
// kubeconfigs at once and several round trips through both API servers.
func BenchmarkGrantToCredential(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	env := harness.New(b)
	cs := federation.OnNodes(b, env, federation.NodeOptions{Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		ArgsFor: func(i int) []string {
			if i == 1 {
				return []string{"--offload-to=auto"} // the consumer uses the grant at once
			}
			return nil
		}})
	prov, cons := cs[0], cs[1]
	federation.WaitPhases(b, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	servers := map[string]*federation.Cluster{"provider": prov.Cluster, "consumer": cons.Cluster}
	w := watchConditions(b, cons.Cluster)
	defer w.stop()
	busy.Run(b, func(b *testing.B) {
		var took []time.Duration
		var requests []int
		for i := 0; b.Loop(); i++ {
			reqs := startRequests(servers)
			start := time.Now()
			setOffloading(b, prov, cons.Name, v1alpha1.OffloadingGrant)
			w.until(prov.Name, v1alpha1.ConditionOffloadCredential, "Ready", 30*time.Second)
			took = append(took, time.Since(start))
			counts, total := reqs.end(servers)
			requests = append(requests, total)
			if i == 0 {
				printRequests(b.Name()+": API requests served until Ready, first round (the benchmark's own included)", counts, total)
			}

			setOffloading(b, prov, cons.Name, v1alpha1.OffloadingDeny)
			w.until(prov.Name, v1alpha1.ConditionOffloadCredential, "Revoked", 30*time.Second)
			waitTenantsGone(b, prov, 90*time.Second)
		}
		b.ReportMetric(ms(spreadOf(append([]time.Duration(nil), took...)).median), "ms-grant-to-credential")
		b.ReportMetric(0, "ns/op")
		fmt.Fprintf(os.Stdout, "%s: Grant to a working credential on the consumer %s (ms: median, min, max, rounds); API requests served per round %v\n", b.Name(), spreadOf(took), requests)
	})
}

func setOffloading(t testing.TB, c *federation.NodeCluster, peer string, o v1alpha1.Offloading) {
	t.Helper()
	changePeerSpec(t, c.Cluster, peer, func(s *v1alpha1.PeerSpec) { s.Offloading = o })
}

// waitTenantsGone waits until c has no tenant namespace.
func waitTenantsGone(t testing.TB, c *federation.NodeCluster, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		nss, err := c.CP.Client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: offload.LabelTenant})
		if err == nil && len(nss.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant namespaces of %s not gone after %s (err %v)", c.Name, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
