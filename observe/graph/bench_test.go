package graph

import (
	"fmt"
	"io"
	"slices"
	"testing"
	"time"
)

// BenchmarkBuildSVG merges n clusters' reports of a full mesh and draws
// it: flotilla graph --format svg with n kubeconfigs, reading aside.
func BenchmarkBuildSVG(b *testing.B) {
	for _, n := range []int{3, 30} {
		b.Run(fmt.Sprintf("clusters-%d", n), func(b *testing.B) {
			reports := fullMesh(n)
			var runs []time.Duration
			for b.Loop() {
				start := time.Now()
				if err := WriteSVG(io.Discard, Build(reports, now)); err != nil {
					b.Fatal(err)
				}
				runs = append(runs, time.Since(start))
			}
			slices.Sort(runs)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(runs[len(runs)/2]), "ms-median")
			b.ReportMetric(ms(runs[0]), "ms-min")
			b.ReportMetric(ms(runs[len(runs)-1]), "ms-max")
		})
	}
}
