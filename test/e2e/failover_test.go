package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A gateway node dies under traffic: cluster a has three gateway
// candidates and two agent replicas (--leader-elect), b one gateway; a
// pod on a worker of each talks to the other's, both directions, a new
// TCP connection every 20 ms. a's active gateway node is killed (its
// network and every process on it at once): the standby takes over,
// every flow resumes, the gap per flow is printed; no Peer's views change
// on either side, and b's Peer of a keeps a's identity and WireGuard key
// while its endpoint moves to the new gateway. The dead node is removed
// as an operator would, and a new standby comes up on the third
// candidate. Both replicas are then restarted with their state
// directories wiped in turn (wipeInTurn): the cluster stays the same to
// b each time, its state coming back from the replica that kept it; the
// last of them drains the active node (each flow's gap printed beside
// the kill's).
// Last, killing the standby cuts no flow.
func TestGatewayFailover(t *testing.T) {
	longRunning(t)
	cs, flows := failoverClusters(t, 3)
	explainFlows(t, cs, flows)
	a, b := cs[0], cs[1]
	before := peerViews(t, cs)

	active, dead := activeGateway(t, a)
	killed := time.Now()
	if err := dead.Kill(); err != nil {
		t.Fatal(err)
	}
	down := time.Now() // the node's link is down: no try after this crosses it
	t.Logf("killed %s's active gateway node %s (agent pod %s) in %s", a.Name, dead.NodeName, active.Name, down.Sub(killed).Round(time.Millisecond))
	killGaps := make(map[*flow]time.Duration, len(flows))
	for _, f := range flows {
		resumed := f.waitOK(t, down, 90*time.Second)
		last, _ := f.lastOKBefore(killed)
		killGaps[f] = resumed.Sub(last)
		t.Logf("flow %s: gap %s (last answer %s before the kill, first %s after)", f.name,
			killGaps[f].Round(time.Millisecond), killed.Sub(last).Round(time.Millisecond), resumed.Sub(killed).Round(time.Millisecond))
	}
	// The data path comes back before the new active replica labels its
	// pod (it does once all its components started), and the dead pod
	// keeps its label until then.
	next, gw := activeGatewayBesides(t, a, active)
	if gw == dead {
		t.Fatalf("the active agent is pod %s on the dead node %s", next.Name, gw.NodeName)
	}
	if l := leaseOf(t, a); l.Spec.AcquireTime != nil {
		t.Logf("the replica on %s took the Lease %s after the kill", gw.NodeName, l.Spec.AcquireTime.Sub(killed).Round(time.Millisecond))
	}
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 30*time.Second)
	t.Run("the workers' routes moved with the Lease, ahead of the new plan", func(t *testing.T) {
		for _, w := range a.Workers {
			if !fabricMovedWithLease(t, a, w.NodeName, gw.NodeName, killed) {
				t.Errorf("the fabric on %s did not log that the gateway moved to %s with the Lease", w.NodeName, gw.NodeName)
			}
		}
	})
	t.Run("no view changed, b sees the same a at its new gateway", func(t *testing.T) {
		if after := peerViews(t, cs); !reflect.DeepEqual(before, after) {
			t.Errorf("Peers before the kill:\n%s\nafter:\n%s", before, after)
		}
		want := netip.AddrPortFrom(gw.Addr, 51820).String()
		eventually.Within(t, 30*time.Second, "b's Peer of a at the new gateway", func() error {
			peers, err := b.Peers(context.Background())
			if err != nil {
				return err
			}
			p := peers[a.Name]
			if p.Status.Endpoint != want {
				return fmt.Errorf("b's Peer of a has endpoint %q, want the new gateway's %s", p.Status.Endpoint, want)
			}
			return nil
		})
		for _, f := range flows {
			if wrong := f.wrongAnswers(); len(wrong) > 0 {
				t.Errorf("flow %s: answers seen as another address than %s: %v", f.name, f.want, wrong)
			}
		}
	})

	// As an operator does once a node is dead for good; flotilla info
	// would wait on a dead node's kubelet for the pod's checks.
	a.RemoveDeadNode(t, dead)
	t.Run("flotilla info and an Event name the new active node", func(t *testing.T) {
		out, err := exec.Command(harness.Flotilla(t), "info", "--kubeconfig", a.CP.Kubeconfig, "-o", "json").CombinedOutput()
		var info struct {
			Agent struct {
				Gateway struct {
					Elected bool
					Node    string
					Since   *metav1.MicroTime
					Changes int32
				}
			}
		}
		if err != nil || json.Unmarshal(out, &info) != nil {
			t.Fatalf("flotilla info -o json: %v\n%s", err, out)
		}
		if g := info.Agent.Gateway; !g.Elected || g.Node != gw.NodeName || g.Since == nil || g.Since.Time.Before(killed) || g.Changes < 1 {
			t.Errorf("flotilla info's gateway %+v, want active on %s since after %s, having changed hands", g, gw.NodeName, killed.Format(time.StampMilli))
		}
		evs, err := a.CP.Client.CoreV1().Events(federation.AgentNamespace).List(context.Background(),
			metav1.ListOptions{FieldSelector: "involvedObject.name=" + next.Name + ",reason=" + ha.EventTookOver})
		if err != nil || len(evs.Items) == 0 {
			t.Errorf("no Event %s on the new active pod %s (%v)", ha.EventTookOver, next.Name, err)
		}
	})

	if !t.Run("both replicas restarted on wiped disks in turn, the state comes back from the survivor, the last time from a drained node", func(t *testing.T) {
		var drained map[*flow]time.Duration
		next, drained = wipeInTurn(t, cs, flows, next, before)
		// Not asserted: on a loaded machine a replica that just took over
		// may miss its renewals for a lease duration while it starts, and
		// fence itself for seconds, in a drain as after a kill.
		for _, f := range flows {
			t.Logf("flow %s: the drain of the active node cut it for %s, the kill of one for %s", f.name, drained[f].Round(time.Millisecond), killGaps[f].Round(time.Millisecond))
		}
	}) {
		return
	}

	t.Run("killing the standby cuts no flow", func(t *testing.T) {
		standby := waitStandby(t, a, next)
		sgw := a.Candidate(standby.Spec.NodeName)
		lease := leaseOf(t, a)
		killed := time.Now()
		if err := sgw.Kill(); err != nil {
			t.Fatal(err)
		}
		// The witness that the active replica went on past the standby's
		// death: it renewed the Lease later than a lease duration after the
		// kill, and every flow answered after that.
		var renewed time.Time
		eventually.Within(t, 60*time.Second, "the active replica renews the Lease after the standby died", func() error {
			l := leaseOf(t, a)
			if *l.Spec.HolderIdentity != *lease.Spec.HolderIdentity {
				return fmt.Errorf("the Lease moved from %s to %s", *lease.Spec.HolderIdentity, *l.Spec.HolderIdentity)
			}
			if renewed = l.Spec.RenewTime.Time; renewed.Before(killed.Add(ha.DefaultLeaseDuration)) {
				return fmt.Errorf("the Lease was last renewed %s after the standby's kill, want a lease duration (%s)", renewed.Sub(killed), ha.DefaultLeaseDuration)
			}
			return nil
		})
		// The active replica's data path stayed, unless its own renewals
		// came late: with the heartbeat, a standby that answered its pings
		// could take the Lease early (it cannot tell the standby dead from
		// cut off), so a renewal not accepted within lateRenewal of the last
		// fences it, the standby dead or alive (docs/ha.md, "the API server
		// answers renewals late"). That happens on a loaded machine; a
		// fence any sooner after an accepted renewal is a defect.
		fences := 0
		for _, l := range agentLinesBetween(t, a, next, killed, renewed) {
			switch {
			case strings.Contains(l.Text, "removing the data path"):
				fences++
				if since := l.Time.Sub(l.LastRenewal); l.LastRenewal.IsZero() || since < lateRenewal {
					t.Errorf("the active agent %s fenced itself %s after its last accepted renewal, sooner than a standby could take the Lease (%s): %s", next.Name, since, lateRenewal, l.Text)
				}
			case strings.Contains(l.Text, "data path removed"):
				if fences == 0 {
					t.Errorf("the active agent %s removed its data path after the standby died, with no fence before: %s", next.Name, l.Text)
				}
			}
		}
		for _, f := range flows {
			f.waitOK(t, renewed, 30*time.Second)
			if fences == 0 {
				f.noLoss(t, killed, renewed, "after the standby "+sgw.NodeName+" was killed")
				continue
			}
			l := f.lossesBetween(killed, renewed)
			t.Logf("flow %s: %d tries lost in a row and %d scattered of %d, while the active replica was fenced %d times for renewals accepted late", f.name, len(l.cut), len(l.scattered), l.tries, fences)
		}
		if fences > 0 {
			t.Logf("the active agent %s fenced itself %d times after the standby died, each time %s or more after its last accepted renewal; every flow answered again", next.Name, fences, lateRenewal)
		}
		if now, _ := activeGateway(t, a); now.UID != next.UID {
			t.Errorf("the active agent changed from %s to %s", next.Name, now.Name)
		}
		a.RemoveDeadNode(t, sgw)
	})
	for _, f := range flows {
		f.stop()
	}
}

// failoverClusters brings up two connected clusters of real nodes, a
// with candidates gateway candidates and two agent replicas (with args
// added to its agent's), b with one,
// each with a worker, and starts a flow each way between the workers'
// pods, answered once. The pods have the same name and address in both
// clusters: only their UIDs tell a flow that crossed from one that looped
// back.
func failoverClusters(t testing.TB, candidates int, args ...string) ([]*federation.NodeCluster, []*flow) {
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		Workers: 1, CandidatesOf: []int{candidates, 1},
		ArgsFor: func(i int) []string {
			if i == 0 {
				return args
			}
			return nil
		},
	})
	a, b := cs[0], cs[1]
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	wa := federation.RunWeb(t, a, a.Workers[0], "web-w1")
	wb := federation.RunWeb(t, b, b.Workers[0], "web-w1")
	for _, r := range []federation.Result{federation.FetchPods(t, a, wa, b, wb), federation.FetchPods(t, b, wb, a, wa)} {
		if r.Err != nil {
			t.Fatalf("%s's pod -> %s's pod at %s: %v", r.From.Name, r.To.Name, r.Dst, r.Err)
		}
	}
	flows := []*flow{startFlow(t, a, wa, b, wb), startFlow(t, b, wb, a, wa)}
	for _, f := range flows {
		f.waitOK(t, time.Now(), 60*time.Second)
	}
	return cs, flows
}

// explainFlows has a flow that does not answer in time print what every
// agent of cs wrote from half a minute before it was waited for (the
// step that broke it began earlier than the wait), deleted
// replicas' included, and what their sockets held unread.
func explainFlows(t *testing.T, cs []*federation.NodeCluster, flows []*flow) {
	logs := make([]*agentLog, len(cs))
	for i, c := range cs {
		logs[i] = recordAgentLogs(t, c)
	}
	for _, f := range flows {
		f.explain = func(t testing.TB, since time.Time) {
			t.Helper()
			for i, c := range cs {
				logs[i].print(t, since)
				sockets(t, c)
			}
		}
	}
}

// activeGateway waits until one agent pod of c is labelled active and
// Ready, and returns it and its node.
func activeGateway(t testing.TB, c *federation.NodeCluster) (corev1.Pod, *harness.Node) {
	t.Helper()
	return activeGatewayBesides(t, c, corev1.Pod{})
}

// activeGatewayBesides is activeGateway for an active pod other than old.
func activeGatewayBesides(t testing.TB, c *federation.NodeCluster, old corev1.Pod) (corev1.Pod, *harness.Node) {
	t.Helper()
	var p corev1.Pod
	eventually.Within(t, 90*time.Second, "an active agent of "+c.Name, func() (err error) {
		if p, err = c.ActiveAgent(context.Background()); err != nil {
			return err
		}
		if old.UID != "" && p.UID == old.UID {
			return fmt.Errorf("pod %s is still labelled active", p.Name)
		}
		return federation.PodReady(p)
	})
	n := c.Candidate(p.Spec.NodeName)
	if n == nil {
		t.Fatalf("the active agent %s runs on %s, not a gateway candidate", p.Name, p.Spec.NodeName)
	}
	return p, n
}

// waitStandby waits until c has a Ready agent pod besides active, on a
// live node, and returns it.
func waitStandby(t testing.TB, c *federation.NodeCluster, active corev1.Pod) corev1.Pod {
	t.Helper()
	var standby corev1.Pod
	eventually.Within(t, 90*time.Second, "a standby agent of "+c.Name, func() error {
		pods, err := c.AgentPods(context.Background())
		if err != nil {
			return err
		}
		for _, p := range pods {
			// Not one being deleted: it is Ready until its agent has
			// stopped, and its replacement starts only then.
			if n := c.Candidate(p.Spec.NodeName); p.UID != active.UID && p.DeletionTimestamp == nil && n != nil && !n.Killed() && federation.PodReady(p) == nil {
				standby = p
				return nil
			}
		}
		return fmt.Errorf("no Ready standby among %d agent pods", len(pods))
	})
	return standby
}

func leaseOf(t testing.TB, c *federation.NodeCluster) *coordinationv1.Lease {
	t.Helper()
	l, err := c.CP.Client.CoordinationV1().Leases(federation.AgentNamespace).Get(context.Background(), ha.LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Lease of %s: %v", c.Name, err)
	}
	if l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
		t.Fatalf("Lease of %s has no holder or renew time: %+v", c.Name, l.Spec)
	}
	return l
}

// peerViews is what a failover must not change, per cluster and Peer:
// the Peer (its name and UID), the cluster's identity and WireGuard key
// as the Peer has them, and the views both ways.
func peerViews(t testing.TB, cs []*federation.NodeCluster) string {
	t.Helper()
	var b strings.Builder
	for _, c := range cs {
		peers, err := c.Peers(context.Background())
		if err != nil {
			t.Fatalf("Peers of %s: %v", c.Name, err)
		}
		for name, p := range peers {
			fmt.Fprintf(&b, "%s: Peer %s (uid %s) of %s key %s views %s theirs %v mine %v\n", c.Name, p.Name, p.UID, name,
				p.Status.PublicKey, p.Status.Views, p.Status.TheirNetworks, p.Status.MyNetworks)
		}
	}
	return b.String()
}

// flow is a worker pod exchanging a line with another cluster's worker
// pod on a new TCP connection every 20 ms (testserver -probe), tries
// overlapping, through kubectl exec: the answers it reports, when each
// came and when its try started, and the failed tries, when each
// started, by the pod's clock (the machine's). Only answers from the
// intended pod count: one from another pod (a path that looped back to
// the caller's own cluster, whose pod has the same name and address)
// fails the test.
type flow struct {
	name     string
	want     netip.Addr // the address the server must see the client as
	to       string     // the server's cluster
	answerer corev1.Pod // the server, as its cluster's API has it
	cmd      *exec.Cmd
	done     chan struct{}

	mu        sync.Mutex
	oks       []time.Time // when each answer came, in the order printed
	tries     []time.Time // when the try of each answer started
	fails     []failure
	wrong     []string // answers seen as another address than want
	strangers int      // answers not from answerer
	stranger  string   // why the first of them was not

	// explain, if set, says why when the flow does not answer in time
	// (explainFlows).
	explain func(t testing.TB, since time.Time)
}

func startFlow(t testing.TB, from *federation.NodeCluster, fromPod corev1.Pod, to *federation.NodeCluster, toPod corev1.Pod) *flow {
	t.Helper()
	dst := federation.ViewOf(t, from.Cluster, to.Cluster, netip.MustParseAddr(toPod.Status.PodIP))
	f := &flow{
		name:     fmt.Sprintf("%s/%s -> %s/%s at %s", from.Name, fromPod.Name, to.Name, toPod.Name, dst),
		want:     federation.ViewOf(t, to.Cluster, from.Cluster, netip.MustParseAddr(fromPod.Status.PodIP)),
		to:       to.Name,
		answerer: toPod,
		done:     make(chan struct{}),
	}
	f.cmd = exec.Command(federation.KubectlPath(), "--kubeconfig", from.CP.Kubeconfig, "exec", fromPod.Name, "--",
		"/testserver", "-probe", netip.AddrPortFrom(dst, harness.TestServerTCPPort).String(), "-every", "20ms", "-timeout", tryTimeout.String(), "-for", "15m")
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatalf("flow %s: %v", f.name, err)
	}
	t.Cleanup(func() {
		f.stop()
		if err := f.strangerAnswers(); err != nil {
			t.Error(err)
		}
	})
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f.note(sc.Text())
		}
	}()
	return f
}

// note records one line of testserver -probe.
func (f *flow) note(line string) {
	kind, rest, _ := strings.Cut(line, " ")
	atNS, rest, _ := strings.Cut(rest, " ")
	ns, err := strconv.ParseInt(atNS, 10, 64)
	if err != nil {
		return
	}
	at := time.Unix(0, ns)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch kind {
	case "ok":
		startNS, line, _ := strings.Cut(rest, " ")
		started, err := strconv.ParseInt(startNS, 10, 64)
		if err != nil {
			return
		}
		a, err := harness.ParseHello(line)
		if err == nil {
			err = federation.AnsweredBy(a, f.to, f.answerer)
		}
		if err != nil {
			if f.strangers++; f.strangers == 1 {
				f.stranger = fmt.Sprintf("at %s: %v", at.Format("15:04:05.000"), err)
			}
			return
		}
		f.oks = append(f.oks, at)
		f.tries = append(f.tries, time.Unix(0, started))
		if a.Seen != f.want {
			f.wrong = append(f.wrong, a.Seen.String())
		}
	case "fail":
		f.fails = append(f.fails, failure{at, rest})
	}
}

func (f *flow) stop() {
	if f.cmd.Process != nil {
		f.cmd.Process.Kill()
		f.cmd.Wait()
	}
}

// waitOK waits until a try that started after t0 was answered, and
// returns when the answer came: an answer to a try of before t0 may
// have crossed the path as it was then (a reply read late on a busy
// machine).
func (f *flow) waitOK(t testing.TB, t0 time.Time, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if err := f.strangerAnswers(); err != nil {
			t.Fatal(err)
		}
		if at, ok := f.firstOKAfter(t0); ok {
			return at
		}
		select {
		case <-f.done:
			t.Fatalf("flow %s: kubectl exec ended: %v", f.name, f.cmd.Wait())
		default:
		}
		if time.Now().After(deadline) {
			f.mu.Lock()
			fails := f.fails[max(0, len(f.fails)-3):]
			f.mu.Unlock()
			if f.explain != nil {
				f.explain(t, t0.Add(-30*time.Second))
			}
			t.Fatalf("flow %s: no answer within %s (last failures: %v)", f.name, timeout, fails)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *flow) firstOKAfter(t0 time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, at := range f.oks {
		if f.tries[i].After(t0) {
			return at, true
		}
	}
	return time.Time{}, false
}

func (f *flow) lastOKBefore(t0 time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.oks) - 1; i >= 0; i-- {
		if f.oks[i].Before(t0) {
			return f.oks[i], true
		}
	}
	return time.Time{}, false
}

// longestGap is the longest time between two answers from the last
// answer before t0 to the first after t1.
func (f *flow) longestGap(t0, t1 time.Time) time.Duration {
	gap, _ := f.longestGapEnd(t0, t1)
	return gap
}

// longestGapEnd is longestGap and the answer that ended it.
func (f *flow) longestGapEnd(t0, t1 time.Time) (longest time.Duration, end time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var prev time.Time
	for _, at := range f.oks {
		if at.Before(t0) {
			prev = at
			continue
		}
		if !prev.IsZero() && at.Sub(prev) > longest {
			longest, end = at.Sub(prev), at
		}
		prev = at
		if at.After(t1) {
			break
		}
	}
	return longest, end
}

// failure is a try that got no answer: when it started, and why.
type failure struct {
	at  time.Time
	err string
}

func (x failure) String() string { return x.at.Format("15:04:05.000") + " " + x.err }

// lateRenewal is how long after its last accepted renewal the active
// replica may fence itself with the heartbeat at its defaults: a standby
// could take the Lease once it has seen no renewal for
// DefaultHeartbeatUnrenewed, and the active replica leaves the margin of
// a retry period before that instant.
const lateRenewal = ha.DefaultHeartbeatUnrenewed - ha.DefaultRetryPeriod

// tryTimeout is how long a flow's try waits for its answer.
const tryTimeout = time.Second

// losses is what became of a flow's failed tries in a window: each try
// that timed out was lost (its packets dropped) or held (queued). Lost
// tries in a run of cutRun or more, or in a run the path never came back
// from, are a cut; fewer in a row, among answered tries, are scattered.
type losses struct {
	tries     int       // tries started in the window
	cut       []failure // in runs of cutRun or more: the path was cut
	scattered []failure // alone or in short runs: the try after them was answered at once
	held      []string  // runs whose packets were held, described
}

// cutRun is how many tries lost in a row make a cut: 80 ms without a
// packet through, where anything that removes or changes the data path
// (a fence, a route replaced, a tunnel suspended) takes a retry period of
// the Lease or more.
const cutRun = 5

// scatteredShare is the share of a window's tries that may be lost
// scattered before a flow counts as lossy: more is a path that drops
// packets, not a loaded machine.
const scatteredShare = 0.05

// lossesBetween sorts the failed tries that started between t0 and t1. A
// try fails when its answer is later than tryTimeout, whether its
// packets were dropped or only held: two cores are shared by every node,
// and the tunnel runs in the gateway's agent process (userspace
// WireGuard); at a load average of 25 that process can go a second
// without running, and the tries of that second time out with their
// packets queued. The two are told apart by the first try that started
// after a run of failed ones: where the path dropped packets and came
// back, its answer comes in milliseconds; where it held them, no answer
// came before the last failed try's deadline, the held packets went
// first, and that try's answer comes after it. On that machine some
// tries are also dropped alone or two in a row, the try 20 ms later
// answered at once, whatever the gateways do: a few in ten thousand in
// the hundred seconds a standby takes to come back at a load average of
// 28, and once nine in the 700 ms after a standby's node was killed, in
// one direction only, with no change of Lease, role or data path.
func (f *flow) lossesBetween(t0, t1 time.Time) losses {
	fails := f.failsBetween(t0, t1) // printed as each ended: in the order they started, but for errors faster than a timeout
	slices.SortFunc(fails, func(x, y failure) int { return x.at.Compare(y.at) })
	f.mu.Lock()
	defer f.mu.Unlock()
	l := losses{tries: len(fails)}
	for _, started := range f.tries {
		if started.After(t0) && started.Before(t1) {
			l.tries++
		}
	}
	for len(fails) > 0 {
		// A run: the failed tries up to the first answered try that
		// started after one of them.
		n, next := len(fails), -1
		for i, started := range f.tries {
			if started.After(fails[0].at) && (next < 0 || started.Before(f.tries[next])) {
				next = i
			}
		}
		if next >= 0 {
			for n = 0; n < len(fails) && fails[n].at.Before(f.tries[next]); n++ {
			}
		}
		run := fails[:n]
		fails = fails[n:]
		last := run[len(run)-1].at
		// Slack for the probe's own scheduling: a try gives up at most this
		// much before its deadline is seen.
		const slack = 100 * time.Millisecond
		switch {
		case next >= 0 && !f.oks[next].Before(last.Add(tryTimeout-slack)):
			l.held = append(l.held, fmt.Sprintf("%d tries from %s to %s held, not lost: the try started at %s was answered %s after it started, %s after the last failed try's deadline",
				len(run), run[0].at.Format("15:04:05.000"), last.Format("15:04:05.000"), f.tries[next].Format("15:04:05.000"),
				f.oks[next].Sub(f.tries[next]).Round(time.Millisecond), f.oks[next].Sub(last.Add(tryTimeout)).Round(time.Millisecond)))
		case next >= 0 && len(run) < cutRun:
			l.scattered = append(l.scattered, run...)
		default:
			l.cut = append(l.cut, run...)
		}
	}
	return l
}

// noLoss fails t when f's path was cut between t0 and t1 (cutRun tries
// in a row lost), or dropped more than scatteredShare of its tries
// scattered; it logs the tries held and those dropped scattered. It
// returns whether it passed, and the losses.
func (f *flow) noLoss(t testing.TB, t0, t1 time.Time, while string) (bool, losses) {
	t.Helper()
	l := f.lossesBetween(t0, t1)
	for _, h := range l.held {
		t.Logf("flow %s: %s", f.name, h)
	}
	if len(l.scattered) > 0 {
		t.Logf("flow %s: %d of %d tries lost scattered (fewer than %d in a row) %s: %v", f.name, len(l.scattered), l.tries, cutRun, while, l.scattered)
	}
	ok := true
	if len(l.cut) > 0 {
		t.Errorf("flow %s: cut %s: %d tries lost in runs of %d or more: %v", f.name, while, len(l.cut), cutRun, l.cut)
		ok = false
	}
	if float64(len(l.scattered)) > scatteredShare*float64(l.tries) {
		t.Errorf("flow %s: %d of %d tries lost scattered %s, more than %.0f%%", f.name, len(l.scattered), l.tries, while, 100*scatteredShare)
		ok = false
	}
	return ok, l
}

// failsBetween lists the failed tries that started between t0 and t1.
func (f *flow) failsBetween(t0, t1 time.Time) []failure {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []failure
	for _, x := range f.fails {
		if x.at.After(t0) && x.at.Before(t1) {
			out = append(out, x)
		}
	}
	return out
}

// strangerAnswers says how many answers came from another pod than the
// intended one and why the first did not count, or is nil.
func (f *flow) strangerAnswers() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.strangers == 0 {
		return nil
	}
	return fmt.Errorf("flow %s: %d answers not from %s's pod %s, the first %s", f.name, f.strangers, f.to, f.answerer.Name, f.stranger)
}

func (f *flow) wrongAnswers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.wrong...)
}

// fabricMovedWithLease reports whether the fabric pod on node of c logged,
// after since, that it moved the gateway to gateway as the Lease changed
// hands, ahead of the new active replica's plan.
func fabricMovedWithLease(t testing.TB, c *federation.NodeCluster, node, gateway string, since time.Time) bool {
	t.Helper()
	pods, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=fabric", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the fabric pod on %s: %d found (%v)", node, len(pods.Items), err)
	}
	lines, err := podLines(c, pods.Items[0], "fabric", func(l logLine) bool {
		return !l.Time.Before(since) && l.Msg == "the gateway moved with the Lease, ahead of the plan" && strings.Contains(l.Text, `"gateway":"`+gateway+`"`)
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(lines) > 0
}
