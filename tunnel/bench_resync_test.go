package tunnel_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// BenchmarkResync measures the repair path at 1000 peers: reading back
// the WireGuard device, our routes and our nftables table and finding
// nothing to change (as the periodic resync does), and, after someone
// flushed our table, putting its 2000 rules back. Medians of b.N runs.
func BenchmarkResync(b *testing.B) {
	site, tun, peers := benchTunnel(b, 1000)
	d := tunnel.Desired{Networks: []netip.Prefix{mustPrefix("10.0.0.0/24")}, Peers: peers}
	if err := site.Do(func() error { return tun.Apply(context.Background(), d) }); err != nil {
		b.Fatal(err)
	}
	resync := func(b *testing.B, breakIt func(), wantChanges bool) {
		var runs []time.Duration
		for range b.N {
			breakIt()
			var n int
			start := time.Now()
			err := site.Do(func() error {
				var err error
				n, err = tunnel.Resync(tun)
				return err
			})
			runs = append(runs, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			if (n > 0) != wantChanges {
				b.Fatalf("resync changed %d objects", n)
			}
		}
		b.ReportMetric(float64(median(runs).Microseconds())/1000, "ms/op")
	}
	b.Run("nothing-changed-at-1000", func(b *testing.B) { resync(b, func() {}, false) })
	b.Run("table-flushed-at-1000", func(b *testing.B) {
		resync(b, func() { site.MustExec("nft", "flush", "table", "ip", "flotilla") }, true)
	})
}
