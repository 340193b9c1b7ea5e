package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/busy"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// From starting every agent of a LAN federation (fresh identities, control
// planes already up) to the first TCP connection crossing between pods of
// every pair, by their views read from the Peer objects. Run with
// -benchtime 5x for a median of 5. Besides the metrics it prints where the
// time went: each agent's start-up and, per direction, the steps the
// agents log (timeline_test.go) and the first packet. Each size runs
// quiet and with both cores kept busy (busy-loops=0 and 2, see
// test/busy).
//
// Anchor: Liqo v0.8 peering took 3.81 s +- 0.78 s; target <= 1 s, also
// under load.
func BenchmarkPeeringFirstPacket(b *testing.B) {
	for _, n := range []int{2, 3, 5} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchFirstPacket(b, n) })
	}
}

func benchFirstPacket(b *testing.B, n int) {
	requireAll(b)
	env := harness.New(b)
	cidrs := make([]string, n)
	for i := range cidrs {
		cidrs[i] = "10.0.0.0/16"
	}
	// JSON logs: the timeline is read from them with full time precision.
	cs := federation.New(b, env, federation.Options{PodCIDRs: cidrs, Args: []string{"--log-level", "info", "--log-format", "json"}})
	keepAgentLogs(b, cs, n)
	watchers := make([]client.WithWatch, n)
	for i, c := range cs {
		w, err := client.NewWithWatch(c.CP.Config, client.Options{Scheme: peerapi.Scheme()})
		if err != nil {
			b.Fatal(err)
		}
		watchers[i] = w
	}
	seq := 0
	busy.Run(b, func(b *testing.B) {
		var samples []time.Duration
		var rounds []*round
		for b.Loop() {
			reset(b, cs, seq)
			seq++
			r := startRound(b, cs, watchers)
			var wg sync.WaitGroup
			errs := make(chan error, n*n)
			for _, from := range cs {
				for _, to := range cs {
					if from != to {
						wg.Add(1)
						go func() { defer wg.Done(); errs <- r.firstConnection(from, to, 60*time.Second) }()
					}
				}
			}
			wg.Wait()
			samples = append(samples, time.Since(r.start))
			r.stop()
			close(errs)
			for err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
			rounds = append(rounds, r)
		}
		for _, r := range rounds {
			if err := r.readLogs(); err != nil {
				b.Fatal(err)
			}
		}
		slices.Sort(samples)
		b.ReportMetric(ms(samples[len(samples)/2]), "ms-median")
		b.ReportMetric(ms(samples[0]), "ms-min")
		b.ReportMetric(ms(samples[len(samples)-1]), "ms-max")
		b.ReportMetric(0, "ns/op")
		// b.Log keeps 10 lines of a benchmark's output: the breakdown goes to
		// stdout, which go test prints whole.
		fmt.Fprint(os.Stdout, breakdown(strings.TrimPrefix(b.Name(), "BenchmarkPeeringFirstPacket/"), rounds, samples))
	})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// benchLogsEnvVar names a directory where the benchmark copies its agents'
// logs, to read the lines behind the timeline.
const benchLogsEnvVar = "FLOTILLA_BENCH_LOGS"

func keepAgentLogs(b *testing.B, cs []*federation.Cluster, n int) {
	dir := os.Getenv(benchLogsEnvVar)
	if dir == "" {
		return
	}
	// Runs before the harness removes the run directory.
	b.Cleanup(func() {
		for _, c := range cs {
			if c.Agent == nil {
				continue
			}
			dst := filepath.Join(dir, fmt.Sprintf("clusters=%d-%s.log", n, c.Name))
			if err := os.WriteFile(dst, []byte(c.Agent.Log()), 0o644); err != nil {
				b.Logf("keep the log of agent %s: %v", c.Name, err)
			}
		}
	})
}

// reset stops the agents and removes everything they made, so the next
// round starts from nothing: no data path, no Peers, new identities.
func reset(b *testing.B, cs []*federation.Cluster, round int) {
	b.Helper()
	for _, c := range cs {
		if c.Agent == nil {
			continue // the first round: nothing to undo
		}
		c.Agent.Stop()
		c.Site.MustExec(c.Bin, "cleanup", "--wireguard-interface", c.Interface())
		os.RemoveAll(c.StateDir)
		if err := c.DeleteLedgerSnapshot(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := c.Client.DeleteAllOf(context.Background(), &v1alpha1.Peer{}); err != nil {
			b.Fatal(err)
		}
		for j, a := range c.Args {
			if a == "--state-dir" {
				c.StateDir = fmt.Sprintf("%s-%d", c.StateDir, round)
				c.Args[j+1] = c.StateDir
			}
		}
	}
}

// round is one start of every agent: when each started, where its log
// stood, and when the benchmark saw each view and each first connection.
type round struct {
	start  time.Time
	cancel context.CancelFunc
	agents map[string]*agentRun

	mu     sync.Mutex
	views  map[pair]netip.Addr
	seen   map[pair]time.Time
	packet map[pair]time.Time
	ready  map[pair]chan struct{}
	// steps and startup are filled in from the agents' logs.
	steps   map[pair]map[peering.Step]time.Time
	startup map[string]map[string]time.Time
}

// pair is a direction: from's view of to.
type pair struct{ from, to string }

type agentRun struct {
	c       *federation.Cluster
	started time.Time
	offset  int64 // where this round's lines start in the agent's log
}

// startRound starts watching every cluster's Peers, then every agent.
func startRound(b *testing.B, cs []*federation.Cluster, watchers []client.WithWatch) *round {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &round{cancel: cancel, agents: map[string]*agentRun{},
		views: map[pair]netip.Addr{}, seen: map[pair]time.Time{}, packet: map[pair]time.Time{}, ready: map[pair]chan struct{}{}}
	for _, from := range cs {
		for _, to := range cs {
			if from != to {
				r.ready[pair{from.Name, to.Name}] = make(chan struct{})
			}
		}
	}
	var synced sync.WaitGroup
	for i, c := range cs {
		synced.Add(1)
		go r.watchViews(ctx, c, cs, watchers[i], synced.Done)
	}
	synced.Wait()
	for _, c := range cs {
		a := &agentRun{c: c}
		if c.Agent != nil {
			if fi, err := os.Stat(c.Agent.LogPath); err == nil {
				a.offset = fi.Size()
			}
		}
		r.agents[c.Name] = a
	}
	// All at once, as a federation's clusters start on their own: started
	// one after another, the last waited for the others' execs.
	r.start = time.Now()
	var wg sync.WaitGroup
	for _, a := range r.agents {
		wg.Go(func() {
			a.started = time.Now()
			a.c.StartAgent(b)
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow() // StartAgent failed in its goroutine
	}
	return r
}

func (r *round) stop() { r.cancel() }

// watchViews records when c's Peer of each other cluster first holds a
// view of that cluster's pod. A watch rather than polling: 20 directions
// polling 5 API servers would load the machine being measured. It calls
// synced once the first list is done.
func (r *round) watchViews(ctx context.Context, c *federation.Cluster, cs []*federation.Cluster, w client.WithWatch, synced func()) {
	once := sync.OnceFunc(synced)
	defer once()
	for ctx.Err() == nil {
		var list v1alpha1.PeerList
		err := w.List(ctx, &list)
		// Before the first agent installs the CRD the list fails, and no
		// Peer exists to be missed: the round may start.
		once()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for i := range list.Items {
			r.noteView(c, cs, &list.Items[i])
		}
		watch, err := w.Watch(ctx, &v1alpha1.PeerList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for ev := range watch.ResultChan() {
			if p, ok := ev.Object.(*v1alpha1.Peer); ok {
				r.noteView(c, cs, p)
			}
		}
		watch.Stop()
	}
}

// noteView records from's view of the pod of the cluster p describes.
func (r *round) noteView(from *federation.Cluster, cs []*federation.Cluster, p *v1alpha1.Peer) {
	at := time.Now()
	for _, to := range cs {
		if to == from || p.Labels[v1alpha1.LabelClusterName] != to.Name {
			continue
		}
		for _, v := range p.Status.TheirNetworks {
			real, err1 := netip.ParsePrefix(v.Range)
			as, err2 := netip.ParsePrefix(v.As)
			if err1 != nil || err2 != nil || !real.Contains(to.Pod.Addr) {
				continue
			}
			k := pair{from.Name, to.Name}
			r.mu.Lock()
			if _, ok := r.views[k]; !ok {
				r.views[k], r.seen[k] = federation.Translate(to.Pod.Addr, real, as), at
				close(r.ready[k])
			}
			r.mu.Unlock()
		}
	}
}

// firstConnection waits for from's view of to's pod, then until from's pod
// completes a TCP connection to to's pod by that view (timed at the
// connect, counted once to's pod says it answered).
func (r *round) firstConnection(from, to *federation.Cluster, timeout time.Duration) error {
	k := pair{from.Name, to.Name}
	deadline := time.After(timeout)
	select {
	case <-r.ready[k]:
	case <-deadline:
		return fmt.Errorf("%s never had a view of %s's pod within %s", from.Name, to.Name, timeout)
	}
	r.mu.Lock()
	dst := netip.AddrPortFrom(r.views[k], federation.PodPort)
	r.mu.Unlock()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		t0 := time.Now()
		conn, err := from.Pod.DialContext(ctx, "tcp", dst.String())
		cancel()
		if err == nil {
			at := time.Now()
			// Counted only once the pod that answered is to's: a wrong
			// view could reach another pod, or loop back to from's own.
			answer, herr := harness.Hello(conn, from.Pod.Name)
			conn.Close()
			if herr != nil {
				return fmt.Errorf("%s reached %s at %s, but: %w", from.Name, to.Name, dst, herr)
			}
			if answer.Host != to.Pod.Name {
				return fmt.Errorf("%s's connection to %s's pod at %s was answered by %s, not %s", from.Name, to.Name, dst, answer.Host, to.Pod.Name)
			}
			r.mu.Lock()
			r.packet[k] = at
			r.mu.Unlock()
			return nil
		}
		select {
		case <-deadline:
			return fmt.Errorf("%s never reached %s's pod at %s within %s: %v", from.Name, to.Name, dst, timeout, err)
		default:
		}
		// Refused or unreachable at once: do not spin.
		if time.Since(t0) < 5*time.Millisecond {
			time.Sleep(5 * time.Millisecond)
		}
	}
}
