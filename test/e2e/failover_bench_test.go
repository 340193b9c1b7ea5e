package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/test/federation"
)

// How long traffic stops when a cluster's gateway moves: two clusters,
// a with two gateway candidates and two agent replicas (--leader-elect),
// b with one gateway, and a worker pod of each exchanging a line with the
// other's on a new TCP connection every 20 ms, both directions. Each
// round first kills a's active gateway node (its network and every
// process on it at once) and measures the longest time any flow went
// without an answer, until another replica is active and every flow
// answered again; a fresh candidate node then replaces the dead one, as
// an operator would. Then it deletes the active agent's pod (a graceful
// stop, as a drain does) and measures the same. Targets: <= 2 s
// median for a kill, <= 0.5 s for a graceful stop; the anchor is
// Submariner's lease (10 s).
func BenchmarkGatewayFailover(b *testing.B) {
	var args []string
	if os.Getenv(benchLeaseOnlyEnvVar) != "" {
		args = []string{"--heartbeat-port=0"}
	}
	cs, flows := failoverClusters(b, 2, args...)
	a := cs[0]
	// gap is the longest time any flow went without an answer from t0
	// until the replica other than was is the active one and every flow
	// answered after that: a killed gateway stops traffic at once, a
	// stopping one forwards until it has handed over.
	gap := func(t0 time.Time, was corev1.Pod) time.Duration {
		now, _ := activeGatewayBesides(b, a, was)
		t1 := time.Now()
		var longest time.Duration
		var answered []string
		for _, f := range flows {
			f.waitOK(b, t1, 90*time.Second)
			g, end := f.longestGapEnd(t0, t1)
			longest = max(longest, g)
			answered = append(answered, "+"+end.Sub(t0).Round(time.Millisecond).String())
		}
		b.Logf("%s took over: %s; flows answered again after %s", now.Spec.NodeName, takeoverTimeline(b, a, now, t0), strings.Join(answered, ", "))
		return longest
	}
	var kills, stops []time.Duration
	for i := 0; b.Loop(); i++ {
		active, node := activeGateway(b, a)
		waitStandby(b, a, active)
		t0 := time.Now()
		if err := node.Kill(); err != nil {
			b.Fatal(err)
		}
		kills = append(kills, gap(t0, active))
		a.RemoveDeadNode(b, node)
		a.AddCandidates(b, fmt.Sprintf("gw%d", i+3))

		active, _ = activeGateway(b, a)
		waitStandby(b, a, active)
		t0 = time.Now()
		if err := a.CP.Client.CoreV1().Pods(active.Namespace).Delete(context.Background(), active.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatalf("delete the active agent's pod %s: %v", active.Name, err)
		}
		stops = append(stops, gap(t0, active))
		b.Logf("round %d: node killed %s, pod deleted %s", i+1, kills[i].Round(time.Millisecond), stops[i].Round(time.Millisecond))
	}
	k, s := spreadOf(slices.Clone(kills)), spreadOf(slices.Clone(stops))
	b.ReportMetric(ms(k.median), "ms-kill-median")
	b.ReportMetric(ms(k.min), "ms-kill-min")
	b.ReportMetric(ms(k.max), "ms-kill-max")
	b.ReportMetric(ms(s.median), "ms-stop-median")
	b.ReportMetric(ms(s.min), "ms-stop-min")
	b.ReportMetric(ms(s.max), "ms-stop-max")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkGatewayFailover: longest time a flow went unanswered: node killed %s, active pod deleted %s (ms: median, min, max, rounds)\n", k, s)
}

// benchLeaseOnlyEnvVar, set, has BenchmarkGatewayFailover run the agents
// without the replicas' heartbeat (--heartbeat-port=0): the Lease alone
// decides, as on a cluster whose firewall closes the heartbeat's port.
const benchLeaseOnlyEnvVar = "FLOTILLA_BENCH_LEASE_ONLY"

// takeoverSteps are what a replica taking over logs on the way, in order:
// the account of where a takeover's time goes that the benchmark prints.
var takeoverSteps = []struct{ msg, name string }{
	// A standby whose process started after t0: it was not standing by
	// when the round began.
	{"agent starting", "process started"},
	{"standby: waiting for the Lease", "standby"},
	{"standby warm: Peers and Nodes listed", "warm"},
	{"the Lease was released: trying to take it now", "saw release"},
	{"the Lease was not renewed for a lease duration: took it", "saw expiry"},
	{"the active replica went silent and the Lease was not renewed: took it", "saw silence"},
	{"this replica is now the active one", "lease"},
	{"identity", "ledger"},
	{"fabric plan published", "plan"},
	{"clusterset zone ready", "dns"},
	{"placement webhook serving", "webhook"},
	{"kubelet API serving the virtual nodes", "kubelet API"},
	{"components started", "started"},
	{"pod labelled with its role", "labelled"},
}

// takeoverTimeline is when pod of c logged each of takeoverSteps after
// t0, and when the fabric on each worker of c first applied a plan after
// pod published its own: "lease +4.1s, ledger +4.3s, ..., w1 fabric
// +4.6s".
func takeoverTimeline(t testing.TB, c *federation.NodeCluster, pod corev1.Pod, t0 time.Time) string {
	t.Helper()
	after := func(l logLine) bool { return !l.Time.Before(t0) }
	lines, err := agentLines(c, pod, after)
	if err != nil {
		return err.Error()
	}
	at := firstLogged(lines, t0)
	var steps []string
	for _, s := range takeoverSteps {
		if d, ok := at[s.msg]; ok {
			steps = append(steps, fmt.Sprintf("%s +%s", s.name, d.Round(time.Millisecond)))
		}
	}
	published, ok := at["fabric plan published"]
	if !ok {
		return strings.Join(steps, ", ")
	}
	fabrics, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=fabric"})
	if err != nil {
		return strings.Join(append(steps, err.Error()), ", ")
	}
	for _, w := range c.Workers {
		for _, p := range fabrics.Items {
			if p.Spec.NodeName != w.NodeName {
				continue
			}
			// The first plan applied once the new one was published.
			lines, err := podLines(c, p, "fabric", func(l logLine) bool { return !l.Time.Before(t0.Add(published)) })
			if d, ok := firstLogged(lines, t0)["fabric applied"]; err == nil && ok {
				steps = append(steps, fmt.Sprintf("%s fabric +%s", w.NodeName, d.Round(time.Millisecond)))
			}
		}
	}
	return strings.Join(steps, ", ")
}

// firstLogged is when each message of lines was first logged, after t0.
func firstLogged(lines []logLine, t0 time.Time) map[string]time.Duration {
	at := map[string]time.Duration{}
	for _, l := range lines {
		if _, seen := at[l.Msg]; !seen && l.Msg != "" {
			at[l.Msg] = l.Time.Sub(t0)
		}
	}
	return at
}
