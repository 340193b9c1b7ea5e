package peering

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// wire stands for WireGuard between the benchmark's fake data planes: a
// pair has its first handshake a round trip after both sides hold each
// other (the later side's keepalive initiates then).
type wire struct {
	mu sync.Mutex
	// since[a][b] is when a's data path first held b.
	since map[tunnel.Key]map[tunnel.Key]time.Time
}

func (w *wire) applied(self tunnel.Key, d tunnel.Desired) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.since == nil {
		w.since = map[tunnel.Key]map[tunnel.Key]time.Time{}
	}
	held := w.since[self]
	if held == nil {
		held = map[tunnel.Key]time.Time{}
		w.since[self] = held
	}
	now := time.Now()
	for _, p := range d.Peers {
		if _, ok := held[p.PublicKey]; !ok {
			held[p.PublicKey] = now
		}
	}
}

// handshake is the first handshake between a and b, zero before both hold
// each other.
func (w *wire) handshake(a, b tunnel.Key) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	ta, ok1 := w.since[a][b]
	tb, ok2 := w.since[b][a]
	if !ok1 || !ok2 {
		return time.Time{}
	}
	at := later(ta, tb).Add(handshakeRTT)
	if time.Now().Before(at) {
		return time.Time{}
	}
	return at
}

// handshakeRTT is how long an initiation and its response take between
// two gateways on a LAN.
const handshakeRTT = 2 * time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// stepLog records the steps an engine logs, with when they were logged
// (or, for the handshake, when it happened).
type stepLog struct {
	mu    sync.Mutex
	steps map[string]map[Step]time.Time // by peer
}

func (l *stepLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *stepLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *stepLog) WithGroup(string) slog.Handler            { return l }

func (l *stepLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != StepMessage {
		return nil
	}
	var step Step
	var peer string
	at := r.Time
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "step":
			step = Step(a.Value.String())
		case "peer":
			peer = a.Value.String()
		case "at":
			if t, ok := a.Value.Any().(time.Time); ok {
				at = t
			}
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.steps == nil {
		l.steps = map[string]map[Step]time.Time{}
	}
	if l.steps[peer] == nil {
		l.steps[peer] = map[Step]time.Time{}
	}
	if _, ok := l.steps[peer][step]; !ok {
		l.steps[peer][step] = at
	}
	return nil
}

// stepConnected is the benchmark's own last step: the engine published
// the peer Connected.
const stepConnected Step = "connected"

// BenchmarkConvergence measures the negotiation of n clusters with each
// other: from starting every engine (fresh identities and ledgers on disk,
// synced writes as in an agent) and reporting every member to every engine
// at once, to every engine having published every peer Connected. The
// transport delivers in memory and a pair's handshake happens when both
// data paths hold each other, so what is measured is the engines' own
// time: ledger writes, the steps in series, the waits for timers. The
// agent's whole path (API servers, gossip, WireGuard) is
// test/e2e's BenchmarkPeeringFirstPacket. Besides median, min and max it
// prints, per step, when it happened after the round started over every
// direction of every round.
func BenchmarkConvergence(b *testing.B) {
	for _, n := range []int{2, 5} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchConvergence(b, n) })
	}
}

func benchConvergence(b *testing.B, n int) {
	loadBefore := loadAverage()
	var samples []time.Duration
	var steps = map[Step][]time.Duration{}
	for b.Loop() {
		d, s := convergeOnce(b, n)
		samples = append(samples, d)
		for k, v := range s {
			steps[k] = append(steps[k], v...)
		}
	}
	slices.Sort(samples)
	b.ReportMetric(ms(samples[len(samples)/2]), "ms-median")
	b.ReportMetric(ms(samples[0]), "ms-min")
	b.ReportMetric(ms(samples[len(samples)-1]), "ms-max")
	b.ReportMetric(0, "ns/op")
	var out strings.Builder
	// The machine is shared: the load says how comparable two runs are.
	fmt.Fprintf(&out, "clusters=%d, %d rounds, all pairs connected: median %.1f ms (min %.1f, max %.1f), load %s / %s\n", n, len(samples),
		ms(samples[len(samples)/2]), ms(samples[0]), ms(samples[len(samples)-1]), loadBefore, loadAverage())
	fmt.Fprintf(&out, "  %-20s %10s %10s %10s %10s\n", "step (per direction)", "median", "p90", "min", "max")
	for _, st := range []Step{StepJoined, StepStatementSent, StepStatementReceived, StepViewsAgreed, StepDataPath, StepHandshake, stepConnected} {
		v := steps[st]
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		fmt.Fprintf(&out, "  %-20s %10.1f %10.1f %10.1f %10.1f\n", st, ms(v[len(v)/2]), ms(v[len(v)*9/10]), ms(v[0]), ms(v[len(v)-1]))
	}
	// b.Log keeps few lines of a benchmark's output: stdout is printed whole.
	fmt.Fprint(os.Stdout, out.String())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// loadAverage is the 1-minute load average, or "?" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// convergeOnce starts n engines and waits until all pairs are connected;
// it returns how long that took and, by step, when each direction reached
// it after the start.
func convergeOnce(b *testing.B, n int) (time.Duration, map[Step][]time.Duration) {
	b.Helper()
	b.StopTimer()
	net, w := &network{}, &wire{}
	nodes := make([]*node, n)
	logs := make([]*stepLog, n)
	var mu sync.Mutex
	connected := make([]map[string]time.Time, n)
	done := make(chan struct{})
	remaining := n * (n - 1)
	var start time.Time
	for i := range nodes {
		logs[i] = &stepLog{}
		connected[i] = map[string]time.Time{}
		nodes[i] = newNode(b, net, nodeOptions{wire: w, resend: 5 * time.Second, logger: slog.New(logs[i])})
		seen := connected[i]
		nodes[i].rec.mu.Lock()
		nodes[i].rec.seen = func(s PeerState) {
			if s.Phase != PhaseConnected {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if _, ok := seen[s.ClusterID]; ok {
				return
			}
			seen[s.ClusterID] = time.Now()
			if remaining--; remaining == 0 {
				close(done)
			}
		}
		nodes[i].rec.mu.Unlock()
	}
	// Every engine has restored its (empty) ledger; the round starts as
	// discovery reports every member to every engine.
	for _, nd := range nodes {
		<-nd.eng.Ready()
	}
	b.StartTimer()
	start = time.Now()
	meet(nodes...)
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatalf("not all %d pairs connected within a minute", n*(n-1))
	}
	took := time.Since(start)
	b.StopTimer()
	for _, nd := range nodes {
		nd.stop()
	}
	steps := map[Step][]time.Duration{}
	for i, nd := range nodes {
		for _, peer := range nodes {
			if peer == nd {
				continue
			}
			id := peer.id.ClusterID()
			logs[i].mu.Lock()
			for st, at := range logs[i].steps[id] {
				steps[st] = append(steps[st], at.Sub(start))
			}
			logs[i].mu.Unlock()
			steps[stepConnected] = append(steps[stepConnected], connected[i][id].Sub(start))
		}
	}
	b.StartTimer()
	return took, steps
}
