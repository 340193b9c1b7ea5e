package discovery

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// startBenchNode starts a member on loopback with the LAN profile
// (memberlist's defaults: gossip every 200 ms, probe every second).
func startBenchNode(b *testing.B, seeds []string) *Discovery {
	b.Helper()
	d, err := New(Config{
		Identity: mustIdentity(b),
		Keys:     [][]byte{testKey},
		BindAddr: netip.MustParseAddrPort("127.0.0.1:0"),
		Seeds:    seeds,
		RetryMin: 100 * time.Millisecond,
		RetryMax: time.Second,
		Profile:  ProfileLAN,
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkConvergence measures, for n members started on loopback, the
// time from the last start until every member sees every other alive.
// Every member is seeded with the first one only.
func BenchmarkConvergence(b *testing.B) {
	for _, n := range []int{10, 50, 100} {
		b.Run("members="+strconv.Itoa(n), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				first := startBenchNode(b, nil)
				nodes := []*Discovery{first}
				seed := first.ml.LocalNode().Address()
				for len(nodes) < n {
					nodes = append(nodes, startBenchNode(b, []string{seed}))
				}
				start := time.Now()
				for _, d := range nodes {
					for len(d.Alive()) < n-1 {
						time.Sleep(5 * time.Millisecond)
						if time.Since(start) > time.Minute {
							b.Fatalf("no convergence in a minute: %d of %d", len(d.Alive()), n-1)
						}
					}
				}
				total += time.Since(start)
				for _, d := range nodes {
					d.kill()
				}
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/converge")
		})
	}
}

// BenchmarkFailureDetection measures, with 10 members on the LAN profile,
// the time from killing one until every other reports it failed.
func BenchmarkFailureDetection(b *testing.B) {
	const n = 10
	var total time.Duration
	for range b.N {
		first := startBenchNode(b, nil)
		nodes := []*Discovery{first}
		for len(nodes) < n {
			nodes = append(nodes, startBenchNode(b, []string{first.ml.LocalNode().Address()}))
		}
		for _, d := range nodes {
			for len(d.Alive()) < n-1 {
				time.Sleep(5 * time.Millisecond)
			}
		}
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
		total += time.Since(start)
		for _, d := range nodes[:n-1] {
			d.kill()
		}
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/detect")
}

// BenchmarkStartToFirstMDNSCandidate measures, in harness sites on one
// LAN, the time from a member process's start until its first mDNS
// candidate (another member already advertising).
func BenchmarkStartToFirstMDNSCandidate(b *testing.B) {
	harness.Require(b, harness.NeedsNetwork...)
	env := harness.New(b)
	sp := newSpawner(b)
	lan := env.NewLAN("lan")
	startMember(b, sp, env.NewSite("a", harness.SiteOptions{LAN: lan}), mustIdentity(b), testKey, true)
	sb := env.NewSite("b", harness.SiteOptions{LAN: lan})
	var total time.Duration
	for range b.N {
		m := startMember(b, sp, sb, mustIdentity(b), testKey, true)
		var ms int
		eventually(b, 30*time.Second, func() error {
			for _, line := range strings.Split(m.proc.Log(), "\n") {
				if v, ok := strings.CutPrefix(line, "first-mdns-candidate "); ok {
					var err error
					ms, err = strconv.Atoi(v)
					return err
				}
			}
			return context.DeadlineExceeded
		})
		total += time.Duration(ms) * time.Millisecond
		_ = m.proc.Stop()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/first-candidate")
}
