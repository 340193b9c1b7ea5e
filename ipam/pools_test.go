package ipam

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// PoolUsage counts what views, quarantined blocks and local networks take
// of each pool, and its largest free block says when the next view of a
// size no longer fits: at -1 ViewOf fails with ErrExhausted.
func TestPoolUsage(t *testing.T) {
	l, clk := openTest(t, Options{Pools: []netip.Prefix{pfx("100.96.0.0/22"), pfx("fdaa::/64")}, Quarantine: time.Minute})
	check := func(step string, used float64, largest int) {
		t.Helper()
		u := l.PoolUsage()
		if len(u) != 2 {
			t.Fatalf("%s: %d pools, want 2", step, len(u))
		}
		got := fmt.Sprintf("%s %v/%v /%d", u[0].Pool, u[0].Used, u[0].Addresses, u[0].LargestFree)
		if want := fmt.Sprintf("100.96.0.0/22 %v/1024 /%d", used, largest); got != want {
			t.Errorf("%s: usage %s, want %s", step, got, want)
		}
		if u[1].Pool != pfx("fdaa::/64") || u[1].Used != 0 || u[1].Addresses != math.Ldexp(1, 64) || u[1].LargestFree != 64 {
			t.Errorf("%s: IPv6 pool %+v, want empty", step, u[1])
		}
	}
	view := func(peer string, want string) {
		t.Helper()
		v, err := l.ViewOf(peer, pfx("10.0.0.0/24"))
		if err != nil || v != pfx(want) {
			t.Fatalf("ViewOf(%s) = %v, %v; want %s", peer, v, err, want)
		}
	}

	check("fresh", 0, 22)
	// The node network sits in the pool's last /24; the pod network makes
	// peers' 10.0.0.0/24 remapped.
	setLocals(t, l, []LocalNetwork{{Range: pfx("100.96.3.0/24"), Kind: NodeNetwork}, {Range: pfx("10.0.0.0/16"), Kind: PodNetwork}})
	check("a local network in the pool", 256, 23)
	view("a", "100.96.0.0/24")
	check("one view", 512, 24)
	if v, err := l.ViewOf("a", pfx("172.16.0.0/16")); err != nil || v != pfx("172.16.0.0/16") {
		t.Fatalf("ViewOf(a, 172.16.0.0/16) = %v, %v", v, err)
	}
	check("a view not remapped takes nothing", 512, 24)
	view("b", "100.96.1.0/24")
	if err := l.Release("b", pfx("10.0.0.0/24")); err != nil {
		t.Fatal(err)
	}
	check("a view in quarantine", 768, 24)
	clk.Advance(time.Minute)
	check("quarantine over", 512, 24)
	view("c", "100.96.1.0/24")
	view("d", "100.96.2.0/24")
	check("full", 1024, -1)
	if _, err := l.ViewOf("e", pfx("10.0.0.0/24")); !errors.Is(err, ErrExhausted) {
		t.Errorf("ViewOf in a full pool: %v, want ErrExhausted", err)
	}
}

func TestLargestAligned(t *testing.T) {
	for _, tc := range []struct {
		first, last string
		want        int
	}{
		{"100.96.0.0", "100.96.3.255", 22},
		{"100.96.1.0", "100.96.2.255", 24},
		{"100.96.0.1", "100.96.0.1", 32},
		{"100.96.0.1", "100.96.0.6", 31},
		{"100.96.0.1", "100.96.0.8", 30},
		{"100.96.0.255", "100.96.2.0", 24},
	} {
		f, l := addrNum(netip.MustParseAddr(tc.first)), addrNum(netip.MustParseAddr(tc.last))
		if got := largestAligned(f, l, 32, 22); got != tc.want {
			t.Errorf("largestAligned(%s, %s) = /%d, want /%d", tc.first, tc.last, got, tc.want)
		}
	}
}

// BenchmarkPoolUsage measures what a scrape of the agent's pool metrics
// costs with 1000 dual-stack peers, every view remapped (2000 views): the
// median, min and max of b.N calls, in µs.
func BenchmarkPoolUsage(b *testing.B) {
	l := benchLedger(b, true)
	var reqs []ViewRequest
	for _, id := range benchPeerIDs() {
		for _, r := range benchRanges {
			reqs = append(reqs, ViewRequest{Peer: id, Remote: r})
		}
	}
	if _, err := l.ViewsOf(reqs); err != nil {
		b.Fatal(err)
	}
	runs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		u := l.PoolUsage()
		runs = append(runs, time.Since(start))
		if u[0].Used != float64(benchPeers*1024) {
			b.Fatalf("pool %s: %v used, want %d", u[0].Pool, u[0].Used, benchPeers*1024)
		}
	}
	slices.Sort(runs)
	b.ReportMetric(float64(runs[len(runs)/2].Nanoseconds())/1000, "µs-median")
	b.ReportMetric(float64(runs[0].Nanoseconds())/1000, "µs-min")
	b.ReportMetric(float64(runs[len(runs)-1].Nanoseconds())/1000, "µs-max")
	b.ReportMetric(0, "ns/op") // the median above is the figure
}
