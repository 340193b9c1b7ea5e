package fabric_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/fabric"
)

// BenchmarkApply measures Apply on a worker node for the views of 1, 10
// and 100 peers (one /24 each): from nothing (after Remove), and a change
// of one view. Each case reports the median of its b.N runs in ms (use
// -benchtime Nx).
func BenchmarkApply(b *testing.B) {
	c := newCluster(b)
	f := c.fabric(b, c.wk)
	views := func(n, first int) []netip.Prefix {
		out := make([]netip.Prefix, n)
		for i := range out {
			j := first + i
			out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + j/256), byte(j % 256), 0}), 24)
		}
		return out
	}
	desired := func(vs []netip.Prefix) fabric.Desired {
		d := c.workerDesired()
		d.Views = vs
		return d
	}
	apply := func(b *testing.B, d fabric.Desired) time.Duration {
		start := time.Now()
		if err := c.wk.Do(func() error { return f.Apply(d) }); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	report := func(b *testing.B, runs []time.Duration) {
		slices.Sort(runs)
		b.ReportMetric(float64(runs[len(runs)/2].Microseconds())/1000, "ms/op")
		b.ReportMetric(0, "ns/op") // the median above is the figure
	}
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("first-%d", n), func(b *testing.B) {
			var runs []time.Duration
			for range b.N {
				remove(b, c.wk)
				runs = append(runs, apply(b, desired(views(n, 0))))
			}
			report(b, runs)
		})
		b.Run(fmt.Sprintf("change-one-at-%d", n), func(b *testing.B) {
			before := desired(views(n, 0))
			after := desired(append(views(n-1, 0), views(1, n)...))
			var runs []time.Duration
			for range b.N {
				apply(b, before)
				runs = append(runs, apply(b, after))
			}
			report(b, runs)
		})
	}
}
