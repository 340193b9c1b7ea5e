package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/federation"
)

// wipeInTurn restarts both agent replicas of cs[0] with their state
// directories wiped, one after the other, as when each node's disk is
// replaced: first the standby's, which must drop nothing; then the
// active one's, once the wiped standby has taken over from it; last the
// other wiped replica takes over in its turn, its node drained as an
// operator does before maintenance (kubectl drain). Each wiped replica
// must restore the ledger from the snapshot the active replica wrote
// while it is the standby, before it takes over. After each step every Peer on both sides is as views
// says (peerViews: the same identity, key and views), the active ledger
// holds what the one before the first step held, and every flow answers
// again. It returns the active agent's pod at the end and each flow's
// longest gap during the drain.
func wipeInTurn(t *testing.T, cs []*federation.NodeCluster, flows []*flow, active corev1.Pod, views string) (corev1.Pod, map[*flow]time.Duration) {
	t.Helper()
	a := cs[0]
	ledger := ledgerFacts(t, a, active.Spec.NodeName)

	standby := waitStandby(t, a, active)
	t0 := time.Now()
	restartWiped(t, a, standby)
	fresh := waitStandby(t, a, active)
	settled := time.Now()
	for _, f := range flows {
		f.waitOK(t, settled, 30*time.Second)
		// A hold of about a second here is seen at any load; its cause is
		// not known yet: the active agent's lines of the window with it.
		if ok, l := f.noLoss(t, t0, settled, "while the standby "+standby.Spec.NodeName+" came back on a wiped disk"); !ok || len(l.held) > 0 {
			logAgentLines(t, a, active, t0, settled)
		}
	}
	if now, _ := activeGateway(t, a); now.UID != active.UID {
		t.Fatalf("the active agent changed from %s to %s while the standby restarted", active.Name, now.Name)
	}
	sameFederation(t, cs, views, ledger, active.Spec.NodeName, "the standby restarted on a wiped disk")

	next, _ := takeOver(t, cs, flows, active, fresh, func() { restartWiped(t, a, active) })
	sameFederation(t, cs, views, ledger, next.Spec.NodeName, "the wiped standby took over and the other replica restarted on a wiped disk")

	last, drained := takeOver(t, cs, flows, next, waitStandby(t, a, next), func() { drain(t, a, next.Spec.NodeName) })
	sameFederation(t, cs, views, ledger, last.Spec.NodeName, "the other wiped replica took over from a drained node")
	return last, drained
}

// drain drains node of c as an operator does before maintenance
// (kubectl drain: cordoned, its pods evicted and gone; --force for the
// harness's test server pod, which no controller owns), then uncordons
// it so that the Deployment's replacement replica can come back there.
func drain(t *testing.T, c *federation.NodeCluster, node string) {
	t.Helper()
	if out, err := federation.Kubectl(c.CP, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "90s"); err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", node, err, out)
	}
	t.Logf("node %s drained", node)
	if _, err := federation.Kubectl(c.CP, "uncordon", node); err != nil {
		t.Fatal(err)
	}
}

// takeOver requires the standby want, whose state directory was wiped,
// to restore the ledger from its snapshot while it is the standby; then
// it stops the active agent pod of cs[0] by stop and requires want to
// take over and every flow to answer again; it prints each flow's
// longest gap, and returns once the cluster has a standby again and
// every Peer is Connected, with those gaps.
func takeOver(t *testing.T, cs []*federation.NodeCluster, flows []*flow, active, want corev1.Pod, stop func()) (corev1.Pod, map[*flow]time.Duration) {
	t.Helper()
	a := cs[0]
	eventually.Within(t, 30*time.Second, "the standby restored the ledger from its snapshot", func() error {
		logs, err := a.CP.Client.CoreV1().Pods(want.Namespace).GetLogs(want.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(context.Background())
		if err != nil {
			return err
		}
		if !strings.Contains(string(logs), "ledger restored from its snapshot") {
			return fmt.Errorf("the standby %s did not log that it restored its ledger", want.Name)
		}
		return nil
	})
	t0 := time.Now()
	stop()
	// A stopping pod keeps its label until its agent has stopped.
	next, _ := activeGatewayBesides(t, a, active)
	if next.UID != want.UID {
		t.Fatalf("the active agent is %s on %s, want the standby %s on %s; the standby wrote:\n%s", next.Name, next.Spec.NodeName, want.Name, want.Spec.NodeName, lastLogs(a, want))
	}
	t1 := time.Now()
	gaps := make(map[*flow]time.Duration, len(flows))
	for _, f := range flows {
		f.waitOK(t, t1, 90*time.Second)
		gaps[f] = f.longestGap(t0, t1)
		t.Logf("flow %s: longest gap %s as %s took over from %s", f.name, gaps[f].Round(time.Millisecond), next.Spec.NodeName, active.Spec.NodeName)
	}
	waitStandby(t, a, next)
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 30*time.Second)
	return next, gaps
}

// restartWiped stops the agent pod p of c and starts it again on its
// node with the node's state directory emptied: the node cordoned, so
// that the replacement the Deployment makes waits, the pod deleted and
// gone, the directory wiped, the node uncordoned.
func restartWiped(t *testing.T, c *federation.NodeCluster, p corev1.Pod) {
	t.Helper()
	node := p.Spec.NodeName
	if _, err := federation.Kubectl(c.CP, "cordon", node); err != nil {
		t.Fatal(err)
	}
	if err := c.CP.Client.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete agent pod %s: %v", p.Name, err)
	}
	eventually.Within(t, 90*time.Second, "agent pod "+p.Name+" gone", func() error {
		_, err := c.CP.Client.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	dir := filepath.Join(c.StateDir, node)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("agent pod %s deleted and %s's state directory wiped (%d entries)", p.Name, node, len(entries))
	if _, err := federation.Kubectl(c.CP, "uncordon", node); err != nil {
		t.Fatal(err)
	}
}

// sameFederation requires that every Peer of cs is as views says and
// that the ledger of c's replica on node holds what want says.
func sameFederation(t *testing.T, cs []*federation.NodeCluster, views string, want ledger, node, after string) {
	t.Helper()
	if now := peerViews(t, cs); now != views {
		t.Errorf("Peers after %s:\n%s\nbefore:\n%s", after, now, views)
	}
	got := ledgerFacts(t, cs[0], node)
	if got.facts != want.facts {
		t.Errorf("ledger of %s's active replica on %s after %s:\n%s\nbefore:\n%s", cs[0].Name, node, after, got.facts, want.facts)
	}
	for name, key := range want.keys {
		if !bytes.Equal(got.keys[name], key) {
			t.Errorf("ledger of %s's active replica on %s after %s: its %s key differs from the one before", cs[0].Name, node, after, name)
		}
	}
}

// ledger is what a replica's ledger holds that a peer relies on: the
// views both ways and the quarantine (facts), and the identity and
// WireGuard keys, compared but never printed.
type ledger struct {
	facts string
	keys  map[string][]byte
}

// ledgerFacts reads the ledger of c's agent replica on node from that
// node's state directory, while the agent runs.
func ledgerFacts(t *testing.T, c *federation.NodeCluster, node string) ledger {
	t.Helper()
	l, err := ipam.OpenSnapshot(filepath.Join(c.StateDir, node, ipam.FileName))
	if err != nil {
		t.Fatalf("ledger of %s's replica on %s: %v", c.Name, node, err)
	}
	defer l.Close()
	out := ledger{keys: map[string][]byte{}}
	for _, name := range []string{"identity", "wireguard"} {
		k, err := l.Key(name)
		if err != nil || len(k) == 0 {
			t.Fatalf("ledger of %s's replica on %s: no %s key (%v)", c.Name, node, name, err)
		}
		out.keys[name] = k
	}
	var lines []string
	peers := map[string]bool{}
	for _, v := range l.Views("") {
		lines = append(lines, fmt.Sprintf("view of %s: %s as %s", v.Peer, v.Remote, v.View))
		peers[v.Peer] = true
	}
	for peer := range peers {
		for _, v := range l.TheirViews(peer) {
			lines = append(lines, fmt.Sprintf("%s's view of ours: %s as %s", v.Peer, v.Mine, v.Theirs))
		}
	}
	for _, q := range l.Quarantine() {
		lines = append(lines, fmt.Sprintf("quarantined %s (%s's %s)", q.Block, q.Peer, q.Remote))
	}
	slices.Sort(lines)
	out.facts = strings.Join(lines, "\n")
	return out
}

// lastLogs is what the agent pod p of c wrote last, in its container and
// the one before if it restarted.
func lastLogs(c *federation.NodeCluster, p corev1.Pod) string {
	var b strings.Builder
	tail := int64(30)
	for _, previous := range []bool{true, false} {
		out, err := c.CP.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent", Previous: previous, TailLines: &tail}).DoRaw(context.Background())
		if err == nil {
			fmt.Fprintf(&b, "(previous container: %v)\n%s\n", previous, out)
		}
	}
	return b.String()
}

// logAgentLines logs what pod's agent said of the Lease and of its data
// path (fenced when it cannot renew in time: the first suspect when a
// flow loses packets with no gateway moving), and everything it said
// between from and to.
func logAgentLines(t *testing.T, c *federation.NodeCluster, pod corev1.Pod, from, to time.Time) {
	t.Helper()
	lines, err := agentLines(c, pod, func(l logLine) bool {
		low := strings.ToLower(l.Text)
		return !l.Time.Before(from) && !l.Time.After(to) || strings.Contains(low, "lease") || strings.Contains(low, "data path")
	})
	if err != nil {
		t.Log(err)
	}
	for _, l := range lines {
		t.Logf("%s: %s", pod.Name, l.Text)
	}
}

// agentLinesBetween is what pod's agent logged between from and to.
func agentLinesBetween(t testing.TB, c *federation.NodeCluster, pod corev1.Pod, from, to time.Time) []logLine {
	t.Helper()
	lines, err := agentLines(c, pod, func(l logLine) bool { return !l.Time.Before(from) && !l.Time.After(to) })
	if err != nil {
		t.Error(err)
	}
	return lines
}

// agentLines is what pod's agent logged that keep says to keep; a line
// that is not JSON has only its Text.
func agentLines(c *federation.NodeCluster, pod corev1.Pod, keep func(logLine) bool) ([]logLine, error) {
	return podLines(c, pod, "agent", keep)
}

// podLines is agentLines for any container of pod.
func podLines(c *federation.NodeCluster, pod corev1.Pod, container string, keep func(logLine) bool) ([]logLine, error) {
	out, err := c.CP.Client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", pod.Name, err)
	}
	var kept []logLine
	for line := range strings.SplitSeq(string(out), "\n") {
		if l := parseLogLine(line); line != "" && keep(l) {
			kept = append(kept, l)
		}
	}
	return kept, nil
}
