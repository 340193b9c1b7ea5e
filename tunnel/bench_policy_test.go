package tunnel_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/tunnel"
)

// podAddr is the i-th of a range of addresses for benchmark sets.
func podAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(100 + i/65536), byte(i / 256 % 256), byte(i%256) | 1})
}

// BenchmarkPolicyUpdate measures how long a change to a Segregated peer's
// allowed set takes to reach the kernel through Tunnel.Apply, the path the
// agent takes: with 10,000 pods allowed, one more (one element added, as
// when a pod is offloaded), and a batch of 10,000 changes (5,000 pods
// removed, 5,000 others added). Apply returns once the kernel has
// acknowledged the transaction, and from then on packets meet the new
// set; the benchmark checks with nft that the last element is there.
// Removing the one element again (a pod unoffloaded) is reported too.
// Median, min and max of b.N runs (use -benchtime Nx).
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
	visible := func(a netip.Addr) {
		out, err := site.Exec(context.Background(), "nft", "get", "element", "ip", table, set, "{", a.String(), "}")
		if err != nil || !strings.Contains(string(out), a.String()) {
			b.Fatalf("element %s not in set %s after Apply: %v\n%s", a, set, err, out)
		}
	}
	base := make([]netip.Addr, 10000)
	for i := range base {
		base[i] = podAddr(i)
	}

	b.Run("one-added-to-10000", func(b *testing.B) {
		apply(base)
		var added, removed []time.Duration
		for i := range b.N {
			added = append(added, apply(append(base[:len(base):len(base)], podAddr(20000+i))))
			removed = append(removed, apply(base))
		}
		apply(append(base[:len(base):len(base)], podAddr(20000)))
		visible(podAddr(20000))
		reportSpread(b, added, "one-added")
		reportSpread(b, removed, "one-removed")
	})
	b.Run("10000-changes-in-one-batch", func(b *testing.B) {
		other := make([]netip.Addr, 10000)
		for i := range other {
			other[i] = podAddr(i + 5000) // 5,000 shared, 5,000 new
		}
		apply(base)
		var runs []time.Duration
		for i := range b.N {
			to := other
			if i%2 == 1 {
				to = base
			}
			runs = append(runs, apply(to))
		}
		apply(other)
		visible(podAddr(14999))
		reportSpread(b, runs, "batch-10000")
	})
}
