package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// standbyWindow is how long BenchmarkStandbyCost samples each replica.
const standbyWindow = 30 * time.Second

// benchStandbyPeersEnvVar sets BenchmarkStandbyCost's peers (the other
// cluster included; at least 1).
const benchStandbyPeersEnvVar = "FLOTILLA_BENCH_STANDBY_PEERS"

// What the standby replica costs at rest, beside the active one, in one
// run: two clusters of real nodes peered, a with two gateway candidates
// and two agent replicas (--leader-elect), and the other peers swarm
// members (swarm_test.go) on a's LAN, nothing offloaded and no traffic.
// Each replica, a pod of the agent's image on its own node, is sampled
// in turn, as BenchmarkAgentMemory samples the agent: its container's
// working set, anonymous memory and Go heap (medians, min to max), and
// its CPU over the window. The standby answers the heartbeat, watches
// the Lease and the agent's pods, and follows the ledger's snapshot
// Secret into its state directory, and keeps the Peers and Nodes listed
// for its takeover; it holds no tunnel or gossip, so its cost grows with
// the peers by their Peer objects, the snapshot's size and how often it
// changes. 100 peers by default:
//
//	FLOTILLA_BENCH_STANDBY_PEERS=100 go test ./test/e2e -run '^$' -bench StandbyCost -benchtime 1x
func BenchmarkStandbyCost(b *testing.B) {
	peers := envCount(b, benchStandbyPeersEnvVar, 100)
	b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) { benchStandbyCost(b, peers) })
}

func benchStandbyCost(b *testing.B, peers int) {
	harness.Require(b, harness.NeedsNodes...)
	harness.Require(b, swarmMemory(peers, benchStandbyPeersEnvVar))
	env := harness.New(b)
	cs := federation.OnNodes(b, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		Workers: 1, CandidatesOf: []int{2, 1},
	})
	a := cs[0]
	federation.WaitPhases(b, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	activePod, activeNode := activeGateway(b, a)
	standbyPod := waitStandby(b, a, activePod)
	standbyNode := a.Candidate(standbyPod.Spec.NodeName)
	if standbyNode == nil {
		b.Fatalf("the standby %s runs on %s, not a gateway candidate", standbyPod.Name, standbyPod.Spec.NodeName)
	}
	if peers > 1 {
		startSwarm(b, env, a, activeNode.Addr, peers-1)
		waitPeersConnected(b, a, peers, 5*time.Minute)
	}
	active := agentContainerIn(b, a, activePod, activeNode)
	standby := agentContainerIn(b, a, standbyPod, standbyNode)
	// Past the start's own allocations: a few collections at rest.
	time.Sleep(10 * time.Second)
	var sa, ss memSamples
	for b.Loop() {
		// One window after the other, in the same run.
		ss = standby.sampleFor(b, standbyWindow)
		sa = active.sampleFor(b, standbyWindow)
	}
	b.StopTimer()
	active.checkSame(b)
	standby.checkSame(b)
	ws := func(m memSamples) uint64 { return medianBytes(m.workingSet) }
	b.ReportMetric(mib(ws(ss)), "MiB-standby-working-set")
	b.ReportMetric(mib(slices.Min(ss.workingSet)), "MiB-standby-working-set-min")
	b.ReportMetric(mib(slices.Max(ss.workingSet)), "MiB-standby-working-set-max")
	b.ReportMetric(mib(ws(sa)), "MiB-active-working-set")
	b.ReportMetric(mib(medianBytes(ss.anon)), "MiB-standby-anon")
	b.ReportMetric(100*ss.cpu, "%cpu-standby")
	b.ReportMetric(float64(ws(ss))/float64(ws(sa)), "standby/active-working-set")
	b.ReportMetric(0, "ns/op")
	for _, r := range []struct {
		name string
		m    memSamples
	}{{"standby", ss}, {"active", sa}} {
		fmt.Fprintf(os.Stdout, "BenchmarkStandbyCost %s: working set %s MiB, anonymous (RssAnon) %s MiB, Go heap in use %s MiB, CPU %.2f%% of a core over %v; %s\n",
			r.name, spreadMiB(r.m.workingSet), spreadMiB(r.m.anon), spreadMiB(r.m.heap), 100*r.m.cpu, standbyWindow, r.m.breakdown())
	}
	fmt.Fprintf(os.Stdout, "BenchmarkStandbyCost: the standby's working set is %.2f of the active replica's (%d peers, nothing offloaded)\n", float64(ws(ss))/float64(ws(sa)), peers)
}
