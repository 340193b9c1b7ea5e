package discovery

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/test/busy"
	"github.com/flotilla-io/flotilla/test/harness"
)

type benchProfile struct {
	name string
	tune func(*memberlist.Config)
	// noRevival turns off the revival of falsely failed members.
	noRevival bool
	// noNotice turns off the notice to a suspected member (notice.go).
	noNotice bool
}

// benchProfiles are the timings compared by the membership benchmarks:
// memberlist's stock LAN profile (the anchor), three other probe timings
// (700 ms; 600 ms with multiplier 3; 500 ms), ours with memberlist's
// transport (a 64 KiB buffer per packet received) and without the
// revival of falsely failed members (a falsely failed member waits for
// its own refutation) or the notice to the suspect, ours without the
// revival alone, ours without the notice alone, and ours.
var benchProfiles = []benchProfile{
	{"memberlist-lan", stockLAN, false, false},
	{"lan-700ms", lan700ms, false, false},
	{"lan-600ms", lan600ms, false, false},
	{"lan-500ms", lan500ms, false, false},
	{"lan-before-revival", netTransport, true, true},
	{"lan-no-revival", nil, true, false},
	{"lan-no-notice", nil, false, true},
	{"lan", nil, false, false},
}

// selectedProfiles are the benchProfiles DISCOVERY_BENCH_PROFILES names
// (comma-separated), all of them when it is unset: `make bench` runs the
// anchor and ours only, the others being the comparisons behind ours.
func selectedProfiles(tb testing.TB) []benchProfile {
	spec := os.Getenv("DISCOVERY_BENCH_PROFILES")
	if spec == "" {
		return benchProfiles
	}
	var out []benchProfile
	for name := range strings.SplitSeq(spec, ",") {
		i := slices.IndexFunc(benchProfiles, func(p benchProfile) bool { return p.name == strings.TrimSpace(name) })
		if i < 0 {
			names := make([]string, len(benchProfiles))
			for j, p := range benchProfiles {
				names[j] = p.name
			}
			tb.Fatalf("DISCOVERY_BENCH_PROFILES=%q: no profile %q; the profiles are %s", spec, name, strings.Join(names, ", "))
		}
		out = append(out, benchProfiles[i])
	}
	return out
}

// netTransport gives the member memberlist's own transport on its bind
// address instead of ours.
func netTransport(c *memberlist.Config) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{c.BindAddr},
		BindPort:  c.BindPort,
		Logger:    c.Logger,
	})
	if err != nil {
		panic(fmt.Sprintf("memberlist transport on %s:%d: %v", c.BindAddr, c.BindPort, err))
	}
	c.Transport = nt
}

// lan700ms is stock LAN with probes every 700 ms.
func lan700ms(c *memberlist.Config) {
	stockLAN(c)
	c.ProbeInterval = 700 * time.Millisecond
	c.ProbeTimeout = 500 * time.Millisecond
}

// lan600ms probes every 600 ms with a 500 ms timeout and suspicion
// multiplier 3 (one confirmation).
func lan600ms(c *memberlist.Config) {
	c.ProbeInterval = 600 * time.Millisecond
	c.ProbeTimeout = 500 * time.Millisecond
	c.SuspicionMult = 3
}

// lan500ms probes every 500 ms with a 450 ms timeout.
func lan500ms(c *memberlist.Config) {
	c.ProbeInterval = 500 * time.Millisecond
	c.ProbeTimeout = 450 * time.Millisecond
}

// stockLAN puts back memberlist's DefaultLANConfig timings.
func stockLAN(c *memberlist.Config) {
	d := memberlist.DefaultLANConfig()
	c.GossipInterval, c.GossipNodes, c.RetransmitMult = d.GossipInterval, d.GossipNodes, d.RetransmitMult
	c.ProbeInterval, c.ProbeTimeout = d.ProbeInterval, d.ProbeTimeout
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = d.SuspicionMult, d.SuspicionMaxTimeoutMult
	c.PushPullInterval, c.EnableCompression = d.PushPullInterval, d.EnableCompression
	c.IndirectChecks, c.AwarenessMaxMultiplier = d.IndirectChecks, d.AwarenessMaxMultiplier
}

// benchTune applies DISCOVERY_BENCH_TUNE, e.g.
// "GossipInterval=100ms,GossipNodes=4", after the profile: a way to try
// timings without editing code.
func benchTune(b *testing.B, c *memberlist.Config) {
	if err := applyTune(os.Getenv("DISCOVERY_BENCH_TUNE"), c); err != nil {
		b.Fatal(err)
	}
}

// applyTune applies a DISCOVERY_BENCH_TUNE spec to c.
func applyTune(spec string, c *memberlist.Config) error {
	for kv := range strings.SplitSeq(spec, ",") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		var err error
		dur := func() time.Duration {
			d, e := time.ParseDuration(v)
			err = cmp.Or(err, e)
			return d
		}
		num := func() int {
			n, e := strconv.Atoi(v)
			err = cmp.Or(err, e)
			return n
		}
		switch k {
		case "GossipInterval":
			c.GossipInterval = dur()
		case "GossipNodes":
			c.GossipNodes = num()
		case "RetransmitMult":
			c.RetransmitMult = num()
		case "ProbeInterval":
			c.ProbeInterval = dur()
		case "ProbeTimeout":
			c.ProbeTimeout = dur()
		case "SuspicionMult":
			c.SuspicionMult = num()
		case "SuspicionMaxTimeoutMult":
			c.SuspicionMaxTimeoutMult = num()
		case "IndirectChecks":
			c.IndirectChecks = num()
		case "AwarenessMaxMultiplier":
			c.AwarenessMaxMultiplier = num()
		case "PushPullInterval":
			c.PushPullInterval = dur()
		case "UDPBufferSize":
			c.UDPBufferSize = num()
		case "EnableCompression":
			c.EnableCompression = v == "true"
		default:
			return fmt.Errorf("DISCOVERY_BENCH_TUNE: unknown setting %q", k)
		}
		if err != nil {
			return fmt.Errorf("DISCOVERY_BENCH_TUNE %s: %w", kv, err)
		}
	}
	return nil
}

// benchNoRevival starts the members of the next benchmark without the
// revival of falsely failed members (benchmarks run one at a time).
var benchNoRevival bool

// benchNoNotice starts them without the notice to suspected members.
var benchNoNotice bool

// startBenchNode starts a member on loopback with the given timings.
func startBenchNode(b *testing.B, tune func(*memberlist.Config), seeds []string) *Discovery {
	b.Helper()
	d, err := newBenchNode(func(c *memberlist.Config) {
		if tune != nil {
			tune(c)
		}
		benchTune(b, c)
	}, seeds)
	if err != nil {
		b.Fatal(err)
	}
	// A benchmark that fails midway must not leave its members gossiping
	// in the process: they would load every benchmark after it.
	b.Cleanup(func() {
		d.mu.Lock()
		closed := d.closed
		d.mu.Unlock()
		if !closed {
			d.kill()
		}
	})
	return d
}

// newBenchNode starts a member on loopback with the given timings, also
// in a member group process (detect_procs_test.go), which has no
// testing.B.
func newBenchNode(tune func(*memberlist.Config), seeds []string) (*Discovery, error) {
	d, err := New(Config{
		Identity: must(identity.Generate()),
		Protocol: testProtocol,
		Keys:     [][]byte{testKey},
		BindAddr: netip.MustParseAddrPort("127.0.0.1:0"),
		Endpoint: "192.0.2.1:51820",
		Seeds:    seeds,
		RetryMin: 100 * time.Millisecond,
		RetryMax: time.Second,
		Profile:  ProfileLAN,
		Tune:     tune,
		// The benchmarks compare with and without (benchNoNotice).
		NoSuspicionNotice: benchNoNotice,
	})
	if err != nil {
		return nil, err
	}
	if benchNoRevival {
		d.revive = nil
	}
	if err := d.Start(context.Background()); err != nil {
		return nil, err
	}
	return d, nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// startCluster starts n members, every one seeded with the first, and
// returns when all are started (not when they see each other).
func startCluster(b *testing.B, tune func(*memberlist.Config), n int) []*Discovery {
	first := startBenchNode(b, tune, nil)
	nodes := []*Discovery{first}
	seed := first.ml.LocalNode().Address()
	for len(nodes) < n {
		nodes = append(nodes, startBenchNode(b, tune, []string{seed}))
	}
	return nodes
}

// convergeLimit bounds waitAllSee. Stock memberlist repairs a lost join
// broadcast only by its push-pull, whose interval it scales with the
// members it knows: 30 s up to 32, 60 s at 50, 90 s at 100 members (LAN
// profile). A limit below that failed the anchor's benchmark instead of
// timing it.
const convergeLimit = 2 * time.Minute

// waitAllSee waits until every node sees want other alive members, or
// fails after convergeLimit.
func waitAllSee(b *testing.B, nodes []*Discovery, want int) {
	start := time.Now()
	diag := os.Getenv("DISCOVERY_BENCH_DIAG") != ""
	for _, d := range nodes {
		for len(d.Alive()) < want {
			time.Sleep(5 * time.Millisecond)
			if diag && time.Since(start) > 4*time.Second {
				diag = false
				for _, o := range nodes {
					if len(o.Alive()) < want {
						b.Logf("after 4 s %s sees %d: %s", o.selfID[:8], len(o.Alive()), missing(o, nodes))
					}
				}
			}
			if time.Since(start) > convergeLimit {
				b.Fatalf("no convergence in %s: %d of %d; %s", convergeLimit, len(d.Alive()), want, missing(d, nodes))
			}
		}
	}
}

// missing describes the nodes d does not see alive, for a failure message.
func missing(d *Discovery, nodes []*Discovery) string {
	states := map[string]string{}
	for _, m := range d.members() {
		states[m.ClusterID] = string(m.State)
	}
	var out []string
	for _, o := range nodes {
		if o != d && states[o.selfID] != string(StateAlive) {
			out = append(out, fmt.Sprintf("%s:%q", o.selfID[:8], states[o.selfID]))
		}
	}
	return fmt.Sprintf("memberlist has %d members; not seen alive: %s", d.ml.NumMembers(), strings.Join(out, " "))
}

// cpuTime is the user and system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// samples collects one duration per iteration and reports their median
// (the machine is shared and noisy; means are dragged by outliers).
type samples []time.Duration

func (s samples) report(b *testing.B, unit string) {
	if len(s) == 0 {
		return
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	med := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + med) / 2
	}
	b.ReportMetric(med.Seconds(), unit)
	b.ReportMetric(sorted[0].Seconds(), "min-"+unit)
	b.ReportMetric(sorted[len(sorted)-1].Seconds(), "max-"+unit)
}

// BenchmarkConvergence measures, for n members started on loopback at
// once, every one seeded with the first (a federation restarting after a
// power cut, a join token handed to everyone), the time from the last
// start until every member sees every other alive (s/converge); then the
// time for one more member, joining the converged federation, to be seen
// by all (s/join-spread).
func BenchmarkConvergence(b *testing.B) {
	for _, p := range selectedProfiles(b) {
		for _, n := range []int{10, 50, 100} {
			b.Run(fmt.Sprintf("profile=%s/members=%d", p.name, n), func(b *testing.B) {
				benchNoRevival, benchNoNotice = p.noRevival, p.noNotice
				var converge, spread, cpu samples
				for range b.N {
					cpu0 := cpuTime()
					nodes := startCluster(b, p.tune, n)
					start := time.Now()
					waitAllSee(b, nodes, n-1)
					converge = append(converge, time.Since(start))
					// CPU of the whole process from the first start until
					// convergence plus one second of settling gossip.
					time.Sleep(time.Second)
					cpu = append(cpu, cpuTime()-cpu0)

					late := startBenchNode(b, p.tune, []string{nodes[n/2].ml.LocalNode().Address()})
					start = time.Now()
					// The late member among those waited for: a failure
					// then names it as the one not seen.
					all := append(nodes, late)
					waitAllSee(b, all, n)
					spread = append(spread, time.Since(start))
					for _, d := range all {
						d.kill()
					}
				}
				converge.report(b, "s/converge")
				spread.report(b, "s/join-spread")
				cpu.report(b, "cpu-s/converge")
			})
		}
	}
}

// BenchmarkFailureDetection measures, with n converged members, the time
// from killing one until every other reports it failed.
func BenchmarkFailureDetection(b *testing.B) {
	for _, p := range selectedProfiles(b) {
		for _, n := range []int{10, 100} {
			b.Run(fmt.Sprintf("profile=%s/members=%d", p.name, n), func(b *testing.B) {
				benchNoRevival, benchNoNotice = p.noRevival, p.noNotice
				var detect samples
				for range b.N {
					nodes := startCluster(b, p.tune, n)
					waitAllSee(b, nodes, n-1)
					time.Sleep(time.Second) // let the join broadcasts drain
					victim := nodes[n-1]
					start := time.Now()
					victim.kill()
					for _, d := range nodes[:n-1] {
						for slices.Contains(d.Alive(), victim.selfID) {
							time.Sleep(5 * time.Millisecond)
							if time.Since(start) > time.Minute {
								b.Fatal("victim not declared failed in a minute")
							}
						}
					}
					detect = append(detect, time.Since(start))
					for _, d := range nodes[:n-1] {
						d.kill()
					}
				}
				detect.report(b, "s/detect")
			})
		}
	}
}

// BenchmarkStartToFirstMDNSCandidate measures, in harness sites on one
// LAN, the time from a member process's start until its first mDNS
// candidate (another member already advertising).
func BenchmarkStartToFirstMDNSCandidate(b *testing.B) {
	harness.Require(b, harness.NeedsNetwork...)
	env := harness.New(b)
	lan := env.NewLAN("lan")
	startMember(b, env.NewSite("a", harness.SiteOptions{LAN: lan}), mustIdentity(b), testKey, true)
	sb := env.NewSite("b", harness.SiteOptions{LAN: lan})
	var first samples
	for range b.N {
		m := startMember(b, sb, mustIdentity(b), testKey, true)
		var ms int
		waitUntil(b, 30*time.Second, func() error {
			for _, line := range strings.Split(m.proc.Log(), "\n") {
				if v, ok := strings.CutPrefix(line, "first-mdns-candidate "); ok {
					var err error
					ms, err = strconv.Atoi(v)
					return err
				}
			}
			return context.DeadlineExceeded
		})
		first = append(first, time.Duration(ms)*time.Millisecond)
		_ = m.proc.Stop()
	}
	first.report(b, "s/first-candidate")
}

// BenchmarkFalseFailures counts the members wrongly declared failed among
// n converged members that all stay up, over a fixed observation time,
// on the machine as it is and with two extra busy loops competing for
// the CPUs (a loaded gateway). Every Failed event is a false positive.
func BenchmarkFalseFailures(b *testing.B) {
	const n, observe = 100, 30 * time.Second
	for _, p := range selectedProfiles(b) {
		for _, hogs := range []int{0, 2} {
			b.Run(fmt.Sprintf("profile=%s/members=%d/busy-loops=%d", p.name, n, hogs), func(b *testing.B) {
				benchNoRevival, benchNoNotice = p.noRevival, p.noNotice
				var failed int
				for range b.N {
					nodes := startCluster(b, p.tune, n)
					waitAllSee(b, nodes, n-1)
					ctx, cancel := context.WithCancel(context.Background())
					counts := make(chan int, n)
					for _, d := range nodes {
						events := d.Subscribe(ctx)
						go func() {
							c := 0
							for ev := range events {
								if ev.Kind == Failed {
									c++
								}
							}
							counts <- c
						}()
					}
					stop := busy.Loops(b, hogs)
					time.Sleep(observe)
					stop()
					cancel()
					for range nodes {
						failed += <-counts
					}
					for _, d := range nodes {
						d.kill()
					}
				}
				b.ReportMetric(float64(failed)/float64(b.N), "false-failed/run")
			})
		}
	}
}
