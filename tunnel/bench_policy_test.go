package tunnel_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// podAddr is the i-th of a range of addresses for benchmark sets.
func podAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(100 + i/65536), byte(i / 256 % 256), byte(i%256) | 1})
}

// BenchmarkPolicyUpdate measures how long a change to a Segregated peer's
// allowed set takes to reach the kernel through Tunnel.Apply, the path the
// agent takes: with 10,000 pods allowed, one more (one element added, as
// when a pod is offloaded) and that one removed again (a pod
// unoffloaded), and a batch of 10,000 changes (5,000 pods removed, 5,000
// others added). Apply returns once the kernel has acknowledged the
// transaction, and from then on packets meet the new set; the benchmark
// checks with nft that the last element is there.
//
// Each round is made twice, the tunnel's netlink socket to nf_tables
// kept open (what the agent does) and a socket per operation, closed
// after it (where the kernel makes a deletion wait for the grace period
// that frees what it deleted), taking turns in one run; the second is
// reported with "per-op-socket" in its name, and the ratio of the two
// medians. Median, min and max of b.N rounds (use -benchtime Nx).
func BenchmarkPolicyUpdate(b *testing.B) {
	site, tun, _ := siteTunnel(b, tunnel.Config{Logger: benchLogger()})
	d := tunnel.Desired{Networks: []netip.Prefix{mustPrefix("10.0.0.0/24")}, Peers: manyPeers(b, 1)}
	table := tunnel.PolicyTable(tunnel.DefaultNFTable)
	set := "pods-" + d.Peers[0].ClusterID
	apply := func(pods []netip.Addr) time.Duration {
		d.Peers[0].Segregated = &policy.Sets{Pods: pods}
		start := time.Now()
		if err := site.Do(func() error { return tun.Apply(context.Background(), d) }); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	visible := func(a netip.Addr, want bool) {
		out, err := site.Exec(context.Background(), "nft", "get", "element", "ip", table, set, "{", a.String(), "}")
		if got := err == nil && strings.Contains(string(out), a.String()); got != want {
			b.Fatalf("element %s in set %s after Apply: %v, want %v (%v)\n%s", a, set, got, want, err, out)
		}
	}
	// both runs round once with a socket kept open and once with a socket
	// per operation.
	both := func(round func(perOp bool)) {
		for _, perOp := range []bool{false, true} {
			tunnel.SetNFTSocketPerOperation(tun, perOp)
			round(perOp)
		}
		tunnel.SetNFTSocketPerOperation(tun, false)
	}
	base := make([]netip.Addr, 10000)
	for i := range base {
		base[i] = podAddr(i)
	}

	b.Run("one-added-to-10000", func(b *testing.B) {
		apply(base)
		var added, removed [2][]time.Duration // by socket kept, per operation
		for i := range b.N {
			both(func(perOp bool) {
				k := 0
				if perOp {
					k = 1
				}
				added[k] = append(added[k], apply(append(base[:len(base):len(base)], podAddr(20000+i))))
				removed[k] = append(removed[k], apply(base))
			})
		}
		apply(append(base[:len(base):len(base)], podAddr(20000)))
		visible(podAddr(20000), true)
		apply(base)
		visible(podAddr(20000), false)
		reportSpread(b, added[0], "one-added")
		reportSpread(b, removed[0], "one-removed")
		reportSpread(b, added[1], "one-added-per-op-socket")
		reportSpread(b, removed[1], "one-removed-per-op-socket")
		reportRatio(b, removed[0], removed[1], "one-removed")
	})
	b.Run("10000-changes-in-one-batch", func(b *testing.B) {
		other := make([]netip.Addr, 10000)
		for i := range other {
			other[i] = podAddr(i + 5000) // 5,000 shared, 5,000 new
		}
		apply(base)
		var runs [2][]time.Duration
		to := base
		for range b.N {
			both(func(perOp bool) {
				k := 0
				if perOp {
					k = 1
				}
				if to = other; slices.Equal(d.Peers[0].Segregated.Pods, other) {
					to = base
				}
				runs[k] = append(runs[k], apply(to))
			})
		}
		apply(other)
		visible(podAddr(14999), true)
		visible(podAddr(0), false)
		reportSpread(b, runs[0], "batch-10000")
		reportSpread(b, runs[1], "batch-10000-per-op-socket")
		reportRatio(b, runs[0], runs[1], "batch-10000")
	})
}

// reportRatio reports the median of runs over that of baseline.
func reportRatio(b *testing.B, runs, baseline []time.Duration, what string) {
	b.ReportMetric(float64(median(runs))/float64(median(baseline)), what+"/per-op-socket")
}

// BenchmarkSegregatedThroughput measures pod-to-pod TCP throughput (iperf3,
// 3 s) from a peer into a site with the peer Full and with it Segregated to
// 10,000 pods and 10,000 service endpoints (the server's pod among them),
// alternating, three rounds each, in one run; it reports the medians and
// their ratio (target: >= 0.95). It runs once whatever b.N is.
func BenchmarkSegregatedThroughput(b *testing.B) {
	m := newMesh(b, "10.1.0.0/16", "10.2.0.0/16")
	m.env.Require(harness.IPerf3)
	a, c := m.sites[0], m.sites[1]
	a.views["b"], c.views["a"] = mustPrefix("10.70.0.0/16"), mustPrefix("10.71.0.0/16")
	a.pod.Start("iperf3", "iperf3", "-s")
	m.applyFullMesh()
	dst := c.seenFrom(a)
	waitUntil(b, 15*time.Second, "ping from the peer's pod", func() bool { return c.pod.Ping(dst) == nil })
	segregated := &policy.Sets{Pods: []netip.Addr{a.pod.Addr}}
	for i := range 10000 {
		segregated.Pods = append(segregated.Pods, podAddr(i))
		segregated.Services = append(segregated.Services, policy.Endpoint{Addr: podAddr(i), Protocol: policy.TCP, Port: 5201})
	}
	measure := func() float64 {
		var out []byte
		var err error
		for range 3 { // the server may still be busy with the last run
			if out, err = c.pod.Exec(context.Background(), "iperf3", "-c", dst.String(), "-t", "3", "-J"); err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			b.Fatalf("iperf3: %v\n%s", err, out)
		}
		gbps, err := harness.IPerf3Gbps(out)
		if err != nil {
			b.Fatal(err)
		}
		return gbps
	}
	var full, seg []float64
	for range 3 {
		m.apply(a, m.desiredFor(a, c))
		full = append(full, measure())
		d := m.desiredFor(a, c)
		d.Peers[0].Segregated = segregated
		m.apply(a, d)
		seg = append(seg, measure())
	}
	b.Logf("Full %v Gbit/s, Segregated %v Gbit/s", full, seg)
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(med(full), "full-Gbit/s")
	b.ReportMetric(med(seg), "segregated-Gbit/s")
	b.ReportMetric(med(seg)/med(full), "segregated/full")
}
