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

	"github.com/flotilla-io/flotilla/test/busy"
)

// BenchmarkDetection is the failure detector's two sides in one run: n
// converged members, every one alive, are watched for observe (30 s, or
// DISCOVERY_BENCH_OBSERVE) with and without busy loops competing for the
// CPUs (DISCOVERY_BENCH_BUSY, default "0,2": the levels to run), and
// every member any other declares failed is a false death
// (false-deaths/run, distinct members; false-failed-events/run counts every
// observer's event). Then one member is killed and the time until every
// other has declared it failed is measured (s/detect, with min- and max-).
// The UDP packets the members send during the observation, per member and
// second, are the price (packets/s/member, bytes/s/member).
//
// The members run in this process (procs=1) or spread over that many
// processes of this test binary (DISCOVERY_BENCH_PROCS, default "1", e.g.
// "1,10"): in one process a garbage collection or a descheduled thread
// stalls all 100 members at once, which a federation, one member per
// agent, never sees. DISCOVERY_BENCH_MEMBERS (default "100") sets how
// many members, e.g. "10,100".
//
// The load is stated in the output: how busy the machine's CPUs were
// from the start of the observation to the detection (machine-busy-%,
// from /proc/stat, every process's, the busy loops' and other work's on
// the machine alike) and the 1-minute load average at the end
// (loadavg).
func BenchmarkDetection(b *testing.B) {
	observe := 30 * time.Second
	if v := os.Getenv("DISCOVERY_BENCH_OBSERVE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("DISCOVERY_BENCH_OBSERVE: %v", err)
		}
		observe = d
	}
	levels := busy.Levels(b, "DISCOVERY_BENCH_BUSY", "0,2")
	procs := busy.Levels(b, "DISCOVERY_BENCH_PROCS", "1")
	for _, p := range selectedProfiles(b) {
		for _, n := range busy.Levels(b, "DISCOVERY_BENCH_MEMBERS", "100") {
			for _, np := range procs {
				for _, hogs := range levels {
					b.Run(fmt.Sprintf("profile=%s/members=%d/procs=%d/busy-loops=%d", p.name, n, np, hogs), func(b *testing.B) {
						benchNoRevival, benchNoNotice = p.noRevival, p.noNotice
						var detect, rejoin samples
						falseDeaths, falseEvents := 0, 0
						var packets, bytes, cpu, alloc, gcs float64
						var stallObserve, stallDetect samples
						var suspicions, refutes, queueFull, udpErrors, stalledDeaths float64
						var busyPct, loadAvg float64
						for range b.N {
							var r detectRun
							if np == 1 {
								r = detectInProcess(b, p.tune, n, hogs, observe)
							} else {
								r = detectInGroups(b, p.name, n, np, hogs, observe)
							}
							detect = append(detect, r.detect)
							falseDeaths += len(r.falseDead)
							falseEvents += r.falseEvents
							rejoin = append(rejoin, r.rejoin...)
							packets += r.packets
							bytes += r.bytes
							cpu += r.cpu
							alloc += r.alloc
							gcs += r.gcs
							stallObserve = append(stallObserve, r.stallObserve)
							stallDetect = append(stallDetect, r.stallDetect)
							suspicions += float64(r.suspicions)
							refutes += float64(r.refutes)
							queueFull += float64(r.queueFull)
							udpErrors += float64(r.udpRcvbufErrors + r.udpInErrors)
							stalledDeaths += float64(r.stalledDeaths)
							busyPct += r.busyPct
							loadAvg += r.loadAvg
						}
						b.ReportMetric(busyPct/float64(b.N), "machine-busy-%")
						b.ReportMetric(loadAvg/float64(b.N), "loadavg")
						detect.report(b, "s/detect")
						b.ReportMetric(float64(falseDeaths)/float64(b.N), "false-deaths/run")
						b.ReportMetric(float64(falseEvents)/float64(b.N), "false-failed-events/run")
						b.ReportMetric(packets/float64(b.N), "packets/s/member")
						b.ReportMetric(bytes/float64(b.N), "bytes/s/member")
						// The price in the processes (100 members, while
						// observed; gc/s summed over the processes).
						b.ReportMetric(cpu/float64(b.N), "cpu-s/s")
						b.ReportMetric(alloc/float64(b.N), "alloc-MB/s")
						b.ReportMetric(gcs/float64(b.N), "gc/s")
						// How long a falsely dead member stayed dead for an
						// observer before it was seen alive again (refuted).
						rejoin.report(b, "s/false-death-rejoin")
						if np > 1 {
							// Why: the longest stall of a member process
							// (median over runs, min, max), memberlist's
							// suspicions and refutations, gossip it dropped,
							// the kernel's UDP receive errors, and false
							// deaths with a process stalled for 2 s or more.
							stallObserve.report(b, "s/stall-observe")
							stallDetect.report(b, "s/stall-detect")
							nb := float64(b.N)
							b.ReportMetric(suspicions/nb, "suspicions/run")
							b.ReportMetric(refutes/nb, "refutes/run")
							b.ReportMetric(queueFull/nb, "gossip-dropped/run")
							b.ReportMetric(udpErrors/nb, "udp-rcv-errors/run")
							b.ReportMetric(stalledDeaths/nb, "stalled-false-deaths/run")
						}
					})
				}
			}
		}
	}
}

// detectRun is what one round of BenchmarkDetection measured.
type detectRun struct {
	detect      time.Duration
	falseDead   map[string]bool // members declared failed while alive
	falseEvents int
	rejoin      samples
	// While observed, per second: packets and bytes sent per member; CPU
	// seconds, MB allocated and garbage collections of all members.
	packets, bytes, cpu, alloc, gcs float64

	// Evidence of the causes of false deaths (members in groups only):
	// the longest stall of any member process while observed and while
	// detecting, the largest 99th percentile, memberlist's suspicions,
	// refutations and dropped gossip messages, the kernel's UDP receive
	// errors during the run and the gossip sockets' receive buffer, and
	// the false deaths whose member's or observer's process stalled for
	// 2 s or more.
	stallObserve, stallDetect, stallP99 time.Duration
	suspicions, refutes, queueFull      int
	memberlistRefutes                   int
	udpRcvbufErrors, udpInErrors        int64
	rcvBuf, stalledDeaths               int
	watchedAt, killedAt                 time.Time
	// The machine's load from the observation's start to the detection:
	// the share of CPU time not idle, and the load average at the end.
	busyPct, loadAvg float64
}

// detectInProcess is one round of BenchmarkDetection with n members in
// this process.
func detectInProcess(b *testing.B, tune func(*memberlist.Config), n, hogs int, observe time.Duration) detectRun {
	var sent sentCounter
	nodes := startCluster(b, sent.tune(tune), n)
	waitAllSee(b, nodes, n-1)
	time.Sleep(time.Second) // let the join broadcasts drain
	victim := nodes[n-1]
	deaths := watchDeaths(nodes, victim.selfID)

	stop := busy.Loops(b, hogs)
	var r detectRun
	load := busy.Mark()
	mark := markCost(&sent)
	time.Sleep(observe)
	r.packets, r.bytes, r.cpu, r.alloc, r.gcs = mark.since(&sent, n)

	deaths.kill(victim)
	start := time.Now()
	waitAllDeclareFailed(b, nodes[:n-1], victim.selfID, start)
	r.detect = time.Since(start)
	r.busyPct, r.loadAvg = load.Since(), busy.LoadAverage()
	stop()

	r.falseDead, r.falseEvents, r.rejoin = deaths.falseDeaths()
	for _, d := range nodes[:n-1] {
		d.kill()
	}
	return r
}

// costMark is the process's counters at the start of an observation.
type costMark struct {
	packets, bytes int64
	cpu            time.Duration
	mem            runtime.MemStats
	at             time.Time
}

func markCost(sent *sentCounter) costMark {
	m := costMark{packets: sent.packets.Load(), bytes: sent.bytes.Load(), cpu: cpuTime(), at: time.Now()}
	runtime.ReadMemStats(&m.mem)
	return m
}

// since returns, per second since the mark, the packets and bytes sent
// per member (of n), and the CPU seconds, MB allocated and garbage
// collections of the process.
func (m costMark) since(sent *sentCounter, n int) (packets, bytes, cpu, alloc, gcs float64) {
	elapsed := time.Since(m.at).Seconds()
	var now runtime.MemStats
	runtime.ReadMemStats(&now)
	packets = float64(sent.packets.Load()-m.packets) / elapsed / float64(n)
	bytes = float64(sent.bytes.Load()-m.bytes) / elapsed / float64(n)
	cpu = (cpuTime() - m.cpu).Seconds() / elapsed
	alloc = float64(now.TotalAlloc-m.mem.TotalAlloc) / elapsed / 1e6
	gcs = float64(now.NumGC-m.mem.NumGC) / elapsed
	return
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
func (w *deathWatch) falseDeaths() (members map[string]bool, events int, rejoin samples) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dead, w.events, w.rejoin
}

// sentCounter counts the UDP packets and bytes members send, through a
// transport that wraps memberlist's own.
type sentCounter struct {
	packets, bytes atomic.Int64
}

// tune returns the profile's tuning followed by the counting transport,
// around the profile's transport or, if it sets none, ours.
func (s *sentCounter) tune(profile func(*memberlist.Config)) func(*memberlist.Config) {
	return func(c *memberlist.Config) {
		if profile != nil {
			profile(c)
		}
		inner, ok := c.Transport.(memberlist.NodeAwareTransport)
		if !ok {
			t, err := newTransport(netip.AddrPortFrom(netip.MustParseAddr(c.BindAddr), uint16(c.BindPort)), slog.New(slog.DiscardHandler), gates{})
			if err != nil {
				// Tune cannot return an error; the benchmark fails either way.
				panic(fmt.Sprintf("gossip transport on %s:%d: %v", c.BindAddr, c.BindPort, err))
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
