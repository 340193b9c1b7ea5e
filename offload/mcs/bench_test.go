package mcs

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkExportToImport measures from a ServiceExport created in b (its
// Service and endpoints already there) to a usable import in a: the
// ServiceImport with its ClusterSetIP in spec.ips, Ready, and the
// translated EndpointSlice present. It reports the median, min and max
// over b.N exports; the target is 1 s median (docs/services.md). The
// exports travel an in-memory bus in place of the gossip.
func BenchmarkExportToImport(b *testing.B) {
	_, cs := newFederation(b, "a", "b")
	imp, exp := cs[0], cs[1]
	imp.ensureNamespace(b, "bench")
	B := exp.id.ClusterID()
	// The first ServiceExport a fresh API server stores takes it about
	// 2 s (the CRD's storage starting), whoever writes it: that is the
	// cluster's setup, not the path measured.
	exp.ensureNamespace(b, "warmup")
	exp.createExport(b, "warmup", "nothing")
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("svc%d", i)
		b.StopTimer()
		exp.ensureNamespace(b, "bench")
		exp.createService(b, "bench", name, 80, "10.1.0.5")
		b.StartTimer()
		start := time.Now()
		exp.createExport(b, "bench", name)
		for {
			im, err := imp.imported("bench", name)
			if err == nil && im.usable(map[string][]string{B: {"10.201.0.5"}}) == nil {
				break
			}
			if time.Since(start) > time.Minute {
				b.Fatalf("%s not imported within a minute: %v", name, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(took[len(took)/2]), "median-ms")
	b.ReportMetric(ms(took[0]), "min-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
	b.ReportMetric(0, "ns/op")
}
