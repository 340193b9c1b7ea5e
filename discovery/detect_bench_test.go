package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
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
				benchNoRevival = p.noRevival
				var detect, rejoin samples
				var falseDeaths, falseEvents int
				var packets, bytes, cpu, alloc, gcs float64
				for range b.N {
					var sent sentCounter
					nodes := startCluster(b, sent.tune(b, p.tune), n)
					waitAllSee(b, nodes, n-1)
					time.Sleep(time.Second) // let the join broadcasts drain
					victim := nodes[n-1]
					deaths := watchDeaths(nodes, victim.selfID)

					stop := busyLoops(b, hogs)
					var m0, m1 runtime.MemStats
					runtime.ReadMemStats(&m0)
					p0, b0, c0, t0 := sent.packets.Load(), sent.bytes.Load(), cpuTime(), time.Now()
					time.Sleep(observe)
					elapsed := time.Since(t0).Seconds()
					cpu += (cpuTime() - c0).Seconds() / elapsed
					runtime.ReadMemStats(&m1)
					alloc += float64(m1.TotalAlloc-m0.TotalAlloc) / elapsed / 1e6
					gcs += float64(m1.NumGC-m0.NumGC) / elapsed
					packets += float64(sent.packets.Load()-p0) / elapsed / n
					bytes += float64(sent.bytes.Load()-b0) / elapsed / n

					deaths.kill(victim)
					start := time.Now()
					waitAllDeclareFailed(b, nodes[:n-1], victim.selfID, start)
					detect = append(detect, time.Since(start))
					stop()

					members, events, back := deaths.falseDeaths()
					falseDeaths += members
					falseEvents += events
					rejoin = append(rejoin, back...)
					for _, d := range nodes[:n-1] {
						d.kill()
					}
				}
				detect.report(b, "s/detect")
				b.ReportMetric(float64(falseDeaths)/float64(b.N), "false-deaths/run")
				b.ReportMetric(float64(falseEvents)/float64(b.N), "false-failed-events/run")
				b.ReportMetric(packets/float64(b.N), "packets/s/member")
				b.ReportMetric(bytes/float64(b.N), "bytes/s/member")
				// The price in the process (100 members, while observed).
				b.ReportMetric(cpu/float64(b.N), "cpu-s/s")
				b.ReportMetric(alloc/float64(b.N), "alloc-MB/s")
				b.ReportMetric(gcs/float64(b.N), "gc/s")
				// How long a falsely dead member stayed dead for an
				// observer before it was seen alive again (refuted).
				rejoin.report(b, "s/false-death-rejoin")
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
// after kill, the victim's are expected and not counted. A member falsely
// declared failed that an observer then sees join again took that long to
// come back (refute) for that observer.
type deathWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	killed atomic.Bool
	victim string

	mu     sync.Mutex
	dead   map[string]bool // members declared failed while alive
	events int
	rejoin samples
}

func watchDeaths(nodes []*Discovery, victim string) *deathWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &deathWatch{cancel: cancel, victim: victim, dead: map[string]bool{}}
	for _, d := range nodes {
		events := d.Subscribe(ctx)
		w.wg.Go(func() {
			failedAt := map[string]time.Time{} // this observer's false deaths
			for ev := range events {
				id := ev.Member.ClusterID
				if id == w.victim && w.killed.Load() {
					continue
				}
				switch ev.Kind {
				case Failed:
					failedAt[id] = time.Now()
					w.mu.Lock()
					w.dead[id] = true
					w.events++
					w.mu.Unlock()
				case Join:
					if at, ok := failedAt[id]; ok {
						delete(failedAt, id)
						w.mu.Lock()
						w.rejoin = append(w.rejoin, time.Since(at))
						w.mu.Unlock()
					}
				}
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
// alive, the number of such events over all observers, and how long each
// such death lasted for its observer until the member was seen again.
func (w *deathWatch) falseDeaths() (members, events int, rejoin samples) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dead), w.events, w.rejoin
}

// sentCounter counts the UDP packets and bytes members send, through a
// transport that wraps memberlist's own.
type sentCounter struct {
	packets, bytes atomic.Int64
}

// tune returns the profile's tuning followed by the counting transport,
// around the profile's transport or, if it sets none, ours.
func (s *sentCounter) tune(b *testing.B, profile func(*memberlist.Config)) func(*memberlist.Config) {
	return func(c *memberlist.Config) {
		if profile != nil {
			profile(c)
		}
		inner, ok := c.Transport.(memberlist.NodeAwareTransport)
		if !ok {
			t, err := newTransport(netip.AddrPortFrom(netip.MustParseAddr(c.BindAddr), uint16(c.BindPort)), slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			inner = t
			if c.BindPort == 0 {
				c.BindPort, c.AdvertisePort = t.Port(), t.Port()
			}
		}
		c.Transport = &countingTransport{NodeAwareTransport: inner, sent: s}
	}
}

type countingTransport struct {
	memberlist.NodeAwareTransport
	sent *sentCounter
}

func (t *countingTransport) WriteTo(p []byte, addr string) (time.Time, error) {
	t.sent.packets.Add(1)
	t.sent.bytes.Add(int64(len(p)))
	return t.NodeAwareTransport.WriteTo(p, addr)
}

func (t *countingTransport) WriteToAddress(p []byte, a memberlist.Address) (time.Time, error) {
	t.sent.packets.Add(1)
	t.sent.bytes.Add(int64(len(p)))
	return t.NodeAwareTransport.WriteToAddress(p, a)
}
