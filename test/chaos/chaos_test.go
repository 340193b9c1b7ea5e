// Package chaos hits a federation of real agents with faults drawn from a
// seed and checks, after each one heals, what users rely on: every pair
// Connected again, pods talking by their views, views disjoint, no view
// reused inside its quarantine, no kernel or API object of ours without an
// owner, no offloaded pod duplicated or lost. `make chaos` runs the long form; `make test` runs a short one
// with a fixed seed (docs/reliability.md).
package chaos_test

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// grace is the agents' --unreachable-grace as federation.New sets it.
const grace = 10 * time.Second

// pingInterval paces the traffic between every pair of pods.
const pingInterval = 100 * time.Millisecond

// outcome is what one fault cost.
type outcome struct {
	converge time.Duration // from the heal until every pair is Connected
	lost     time.Duration // pings lost over all directions, as time
	settled  time.Duration // from Connected until the offloaded pods are as they should
	broken   int           // invariants broken after convergence
}

// podCIDRs are the clusters' pod networks, the first
// FLOTILLA_CHAOS_CLUSTERS of them: a and b equal, c's range holding
// theirs, d's nested in c's beside a's and b's, e's nested in c's and
// holding a's and b's. Every cluster needs views of the others that
// overlap it, drawn from the same remap pools.
var podCIDRs = []string{"10.0.0.0/16", "10.0.0.0/16", "10.0.0.0/14", "10.2.0.0/16", "10.0.0.0/15"}

// TestChaos: FLOTILLA_CHAOS_CLUSTERS clusters (default 3, `make chaos`
// runs 5) of equal and nested PodCIDRs, pings between every pair of pods,
// and faults drawn from FLOTILLA_CHAOS_SEED (default 1),
// FLOTILLA_CHAOS_FAULTS of them (default 3; 0 is no limit), for at most
// FLOTILLA_CHAOS_DURATION (a Go duration; unset is no limit: `make chaos`
// runs one hour). The run prints the seed and a table per fault kind.
func TestChaos(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	seed := envInt(t, "FLOTILLA_CHAOS_SEED", 1)
	n := envInt(t, "FLOTILLA_CHAOS_FAULTS", 3)
	clusters := envInt(t, "FLOTILLA_CHAOS_CLUSTERS", 3)
	duration := envDuration(t, "FLOTILLA_CHAOS_DURATION")
	if n == 0 && duration == 0 {
		t.Fatalf("FLOTILLA_CHAOS_FAULTS=0 needs FLOTILLA_CHAOS_DURATION: the run would never end")
	}
	if clusters < 2 || clusters > len(podCIDRs) {
		t.Fatalf("FLOTILLA_CHAOS_CLUSTERS=%d: want 2 to %d", clusters, len(podCIDRs))
	}
	t.Logf("chaos: seed %d, %d faults (0: no limit), for %s (0: no limit), %d clusters; reproduce with FLOTILLA_CHAOS_SEED=%d FLOTILLA_CHAOS_FAULTS=%d FLOTILLA_CHAOS_DURATION=%s FLOTILLA_CHAOS_CLUSTERS=%d go test -count=1 -run TestChaos ./test/chaos", seed, n, duration, clusters, seed, n, duration, clusters)
	kinds := faultKinds(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	env := harness.New(t)
	lan := env.NewLAN("lan")
	f := &fed{lan: lan, cs: federation.New(t, env, federation.Options{
		LAN:      lan,
		PodCIDRs: podCIDRs[:clusters],
	})}
	f.inv = newInvariants()
	f.pairs = offloadPairs(f.cs)
	mountStateDisks(t, f.cs)
	prepared := time.Now()
	prepareOffload(t, f.cs, f.pairs)
	t.Logf("offloading prepared (roles, schedulers, stand-in kubelets) in %s", time.Since(prepared).Round(10*time.Millisecond))
	federation.Connect(t, f.cs)
	federation.AllPairsTalk(t, f.cs)
	offloading := time.Now()
	startWorkloads(t, f.pairs)
	if broken := checkOffload(t, f.cs, f.pairs, 2*time.Minute); broken > 0 {
		t.Fatalf("the offloaded workloads never settled before any fault")
	}
	t.Logf("%d pairs offloading %d pods each, Running on their providers %s after every pair talked", len(f.pairs), workReplicas, time.Since(offloading).Round(10*time.Millisecond))

	results := map[string][]outcome{}
	start := time.Now()
	for i := 0; (n == 0 || i < n) && (duration == 0 || time.Since(start) < duration); i++ {
		// Every draw comes from the seed, in the same order, so a run is
		// reproduced up to the timing of the machine.
		k := kinds[rng.IntN(len(kinds))]
		victim := f.cs[rng.IntN(len(f.cs))]
		wait := time.Duration(rng.IntN(3000)) * time.Millisecond
		t.Logf("fault %d: %s of %s after %s", i+1, k.name, victim.Name, wait)
		if k.prepare != nil {
			k.prepare(t, f, victim)
		}
		traffic := startTraffic(t, f.cs, i+1)
		time.Sleep(wait)
		agents := agentsOf(f.cs)
		during := k.inject(t, f, victim)
		touched := touchedBy(f.cs, victim, agents)
		healed := time.Now()
		// A restarted agent's Peers still read Connected from before its
		// death: converged means it serves again and every pair is
		// Connected, by the clusters' current identities.
		waitReady(t, victim, 2*time.Minute)
		waitConnected(t, f.cs, 2*time.Minute)
		o := outcome{converge: time.Since(healed)}
		var unanswered map[string]int
		o.lost, unanswered = traffic.stop(t)
		// What a fault of some clusters costs the others: nothing. Their
		// tunnels, views and agents are not part of it.
		o.broken += lossOutside(t, unanswered, touched)
		connected := time.Now()
		o.broken += during + checkOffload(t, f.cs, f.pairs, offloadSettle)
		o.settled = time.Since(connected)
		if f.afterHeal != nil {
			o.broken += f.afterHeal(t)
			f.afterHeal = nil
		}
		o.broken += f.inv.check(t, f.cs)
		t.Logf("fault %d: %s of %s: Connected %s after the heal, offloaded pods settled %s later, %s of traffic lost, %d invariants broken", i+1, k.name, victim.Name, o.converge.Round(10*time.Millisecond), o.settled.Round(10*time.Millisecond), o.lost, o.broken)
		results[k.name] = append(results[k.name], o)
	}
	t.Logf("chaos seed %d, %s of faults:\n%s", seed, time.Since(start).Round(time.Second), table(results))
	t.Logf("views a cluster's new identity kept from its old one: %d", f.inv.kept)
	for _, outs := range results {
		for _, o := range outs {
			if o.broken > 0 {
				t.Fatalf("invariants broken (see above); reproduce with FLOTILLA_CHAOS_SEED=%d FLOTILLA_CHAOS_FAULTS=%d FLOTILLA_CHAOS_DURATION=%s FLOTILLA_CHAOS_CLUSTERS=%d", seed, n, duration, clusters)
			}
		}
	}
}

// waitReady waits until c's agent answers /readyz on its metrics address
// (federation.New's 127.0.0.1:9470, inside the site).
func waitReady(t *testing.T, c *federation.Cluster, within time.Duration) {
	t.Helper()
	if err := readyWithin(c, within); err != nil {
		t.Fatalf("agent of %s not ready after %s: %v\n%s", c.Name, within, err, c.Agent.Tail(20))
	}
}

// readyWithin is waitReady's wait: nil once c's agent is ready, its last
// answer after within, or at once when the agent exited.
func readyWithin(c *federation.Cluster, within time.Duration) error {
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DialContext: c.Site.DialContext},
	}
	deadline := time.Now().Add(within)
	for {
		if exited, err := c.Agent.Exited(); exited {
			return fmt.Errorf("exited: %v", err)
		}
		resp, err := client.Get("http://127.0.0.1:9470/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// traffic is one ping per ordered pair of pods, each to its view of the
// other.
type traffic struct {
	pings []*harness.Process
	// dirs[i] is the direction of pings[i], "from>to" by cluster name.
	dirs  []string
	start time.Time
}

// agentsOf is every cluster's agent process, to tell after a fault whose
// agent it restarted.
func agentsOf(cs []*federation.Cluster) map[*federation.Cluster]*harness.Process {
	out := map[*federation.Cluster]*harness.Process{}
	for _, c := range cs {
		out[c] = c.Agent
	}
	return out
}

// touchedBy is the names of the clusters a fault acted on: the victim and
// every cluster whose agent it restarted (a neighbour killed
// mid-negotiation, the side killed mid-grant or mid-offload).
func touchedBy(cs []*federation.Cluster, victim *federation.Cluster, before map[*federation.Cluster]*harness.Process) map[string]bool {
	out := map[string]bool{victim.Name: true}
	for _, c := range cs {
		if c.Agent != before[c] {
			out[c.Name] = true
		}
	}
	return out
}

// lossOutside returns how many directions between clusters the fault did
// not touch lost a ping, logging each: none may (docs/reliability.md,
// "What bounds each fault").
func lossOutside(t *testing.T, unanswered map[string]int, touched map[string]bool) int {
	t.Helper()
	broken := 0
	for dir, n := range unanswered {
		from, to, _ := strings.Cut(dir, ">")
		if n > 0 && !touched[from] && !touched[to] {
			t.Errorf("%s lost %d pings, but the fault touched only %v", dir, n, slices.Sorted(maps.Keys(touched)))
			broken++
		}
	}
	return broken
}

func startTraffic(t *testing.T, cs []*federation.Cluster, round int) *traffic {
	t.Helper()
	tr := &traffic{start: time.Now()}
	for _, from := range cs {
		for _, to := range cs {
			if from == to {
				continue
			}
			dst := federation.ViewOf(t, from, to, to.Pod.Addr)
			// A log of its own per round: ping's summary is read from it.
			name := fmt.Sprintf("ping-%d-%s-%s", round, from.Name, to.Name)
			interval := strconv.FormatFloat(pingInterval.Seconds(), 'f', -1, 64)
			tr.pings = append(tr.pings, from.Pod.Start(name, "ping", "-n", "-i", interval, "-W", "1", dst.String()))
			tr.dirs = append(tr.dirs, from.Name+">"+to.Name)
		}
	}
	return tr
}

var (
	pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
	pingReply   = regexp.MustCompile(`bytes from .* icmp_seq=(\d+) `)
)

// unansweredOf counts the echo requests 1..sent-1 that ping logged no
// reply to. The last one sent is left out: the interrupt that stops ping
// may come while it is still on its way, and ping counts it unanswered
// then, whatever the network did (the chaos run once failed on such a
// ping between two clusters its fault never touched).
func unansweredOf(log string, sent int) int {
	answered := map[int]bool{}
	for _, m := range pingReply.FindAllStringSubmatch(log, -1) {
		seq, _ := strconv.Atoi(m[1])
		answered[seq] = true
	}
	n := 0
	for seq := 1; seq < sent; seq++ {
		if !answered[seq] {
			n++
		}
	}
	return n
}

// stop ends the pings and returns the time without answers, summed over
// the directions (the pings left unanswered times the interval), and the
// pings left unanswered per direction. Pings
// that could not even be sent (no route) count: ping counts them as
// transmitted, with an error. Not the time the pings ran less the answers:
// on a loaded machine ping paces slower than asked, and that counted
// seconds lost where every ping was answered.
func (tr *traffic) stop(t *testing.T) (time.Duration, map[string]int) {
	t.Helper()
	ran := time.Since(tr.start)
	var lost time.Duration
	var each []string
	unanswered := map[string]int{}
	for i, p := range tr.pings {
		if err := p.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		<-p.Done()
		m := pingSummary.FindStringSubmatch(p.Log())
		if m == nil {
			t.Fatalf("no ping summary in:\n%s", p.Tail(5))
		}
		sent, _ := strconv.Atoi(m[1])
		n := unansweredOf(p.Log(), sent)
		lost += time.Duration(n) * pingInterval
		unanswered[tr.dirs[i]] = n
		if n > 0 {
			each = append(each, fmt.Sprintf("%s %d of %d unanswered", strings.TrimPrefix(p.Name, "ping-"), n, sent))
		}
	}
	t.Logf("traffic over %s: %s", ran.Round(10*time.Millisecond), cmp.Or(strings.Join(each, ", "), "every ping answered"))
	return lost, unanswered
}

// table is the report: per fault kind, how often, time to Connected, time
// from then until the offloaded pods settled, traffic lost (min, median,
// max of each), invariants broken.
func table(results map[string][]outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %5s %28s %28s %28s %7s\n", "fault", "count", "converge min/med/max", "pods settled min/med/max", "lost min/med/max", "broken")
	for _, k := range faults {
		outs := results[k.name]
		if len(outs) == 0 {
			continue
		}
		var conv, settled, lost []time.Duration
		broken := 0
		for _, o := range outs {
			conv = append(conv, o.converge)
			settled = append(settled, o.settled)
			lost = append(lost, o.lost)
			broken += o.broken
		}
		fmt.Fprintf(&b, "%-22s %5d %28s %28s %28s %7d\n", k.name, len(outs), minMedMax(conv), minMedMax(settled), minMedMax(lost), broken)
	}
	return b.String()
}

func minMedMax(ds []time.Duration) string {
	slices.Sort(ds)
	med := ds[len(ds)/2]
	if len(ds)%2 == 0 {
		med = (ds[len(ds)/2-1] + med) / 2
	}
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	return fmt.Sprintf("%s / %s / %s", r(ds[0]), r(med), r(ds[len(ds)-1]))
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// envDuration reads a Go duration from name; unset is 0.
func envDuration(t *testing.T, name string) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}
