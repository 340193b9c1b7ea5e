package discovery

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// BenchmarkDetection is the failure detector's two sides in one run: n
// converged members, every one alive, are watched for observe (30 s, or
// DISCOVERY_BENCH_OBSERVE) with and without two busy loops competing for
// the CPUs, and every member any other declares failed is a false death
// (false-deaths/run, distinct members; false-failed-events/run counts every
// observer's event). Then one member is killed and the time until every
// other has declared it failed is measured (s/detect, with min- and max-).
// The UDP packets the members send during the observation, per member and
// second, are the price (packets/s/member, bytes/s/member).
func BenchmarkDetection(b *testing.B) {
	observe := 30 * time.Second
	if v := os.Getenv("DISCOVERY_BENCH_OBSERVE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("DISCOVERY_BENCH_OBSERVE: %v", err)
		}
		observe = d
	}
	const n = 100
	for _, p := range benchProfiles {
		for _, hogs := range []int{0, 2} {
			b.Run(fmt.Sprintf("profile=%s/members=%d/busy-loops=%d", p.name, n, hogs), func(b *testing.B) {
				var detect samples
				var falseDeaths, falseEvents int
				var packets, bytes float64
				for range b.N {
					var sent sentCounter
					nodes := startCluster(b, sent.tune(b, p.tune), n)
					waitAllSee(b, nodes, n-1)
					time.Sleep(time.Second) // let the join broadcasts drain
					victim := nodes[n-1]
					deaths := watchDeaths(nodes, victim.selfID)

					stop := busyLoops(b, hogs)
					p0, b0, t0 := sent.packets.Load(), sent.bytes.Load(), time.Now()
					time.Sleep(observe)
					secs := time.Since(t0).Seconds() * n
					packets += float64(sent.packets.Load()-p0) / secs
					bytes += float64(sent.bytes.Load()-b0) / secs

					deaths.kill(victim)
					start := time.Now()
					waitAllDeclareFailed(b, nodes[:n-1], victim.selfID, start)
					detect = append(detect, time.Since(start))
					stop()

					members, events := deaths.falseDeaths()
					falseDeaths += members
					falseEvents += events
					for _, d := range nodes[:n-1] {
						d.kill()
					}
				}
				detect.report(b, "s/detect")
				b.ReportMetric(float64(falseDeaths)/float64(b.N), "false-deaths/run")
				b.ReportMetric(float64(falseEvents)/float64(b.N), "false-failed-events/run")
				b.ReportMetric(packets/float64(b.N), "packets/s/member")
				b.ReportMetric(bytes/float64(b.N), "bytes/s/member")
			})
		}
	}
}

// waitAllDeclareFailed waits until none of nodes sees victim alive, or
// fails after a minute.
func waitAllDeclareFailed(b *testing.B, nodes []*Discovery, victim string, start time.Time) {
	for _, d := range nodes {
		for d.sees(victim) {
			time.Sleep(5 * time.Millisecond)
			if time.Since(start) > time.Minute {
				b.Fatal("victim not declared failed in a minute")
			}
		}
	}
}

// sees says whether d holds id as an alive member.
func (d *Discovery) sees(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.table[id]
	return ok && m.State == StateAlive
}

// deathWatch counts the Failed events of every member's subscription;
// after kill, the victim's are expected and not counted.
type deathWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	killed atomic.Bool
	victim string

	mu     sync.Mutex
	dead   map[string]bool // members declared failed while alive
	events int
}

func watchDeaths(nodes []*Discovery, victim string) *deathWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &deathWatch{cancel: cancel, victim: victim, dead: map[string]bool{}}
	for _, d := range nodes {
		events := d.Subscribe(ctx)
		w.wg.Go(func() {
			for ev := range events {
				if ev.Kind != Failed || (ev.Member.ClusterID == w.victim && w.killed.Load()) {
					continue
				}
				w.mu.Lock()
				w.dead[ev.Member.ClusterID] = true
				w.events++
				w.mu.Unlock()
			}
		})
	}
	return w
}

// kill kills the victim; from now on its deaths are true ones.
func (w *deathWatch) kill(victim *Discovery) {
	w.killed.Store(true)
	victim.kill()
}

// falseDeaths stops watching and returns the members declared failed while
// alive and the number of such events over all observers.
func (w *deathWatch) falseDeaths() (members, events int) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dead), w.events
}

// sentCounter counts the UDP packets and bytes members send, through a
// transport that wraps memberlist's own.
type sentCounter struct {
	packets, bytes atomic.Int64
}

// tune returns the profile's tuning followed by the counting transport.
func (s *sentCounter) tune(b *testing.B, profile func(*memberlist.Config)) func(*memberlist.Config) {
	return func(c *memberlist.Config) {
		if profile != nil {
			profile(c)
		}
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{c.BindAddr},
			BindPort:  c.BindPort,
			Logger:    c.Logger,
		})
		if err != nil {
			b.Fatal(err)
		}
		c.Transport = &countingTransport{NetTransport: nt, sent: s}
	}
}

type countingTransport struct {
	*memberlist.NetTransport
	sent *sentCounter
}

func (t *countingTransport) WriteTo(p []byte, addr string) (time.Time, error) {
	t.sent.packets.Add(1)
	t.sent.bytes.Add(int64(len(p)))
	return t.NetTransport.WriteTo(p, addr)
}

func (t *countingTransport) WriteToAddress(p []byte, a memberlist.Address) (time.Time, error) {
	t.sent.packets.Add(1)
	t.sent.bytes.Add(int64(len(p)))
	return t.NetTransport.WriteToAddress(p, a)
}
