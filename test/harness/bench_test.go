package harness_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// reportMedian reports the median, min and max of samples in milliseconds.
func reportMedian(b *testing.B, samples []time.Duration) {
	b.Helper()
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(samples[len(samples)/2]), "ms-median")
	b.ReportMetric(ms(samples[0]), "ms-min")
	b.ReportMetric(ms(samples[len(samples)-1]), "ms-max")
	b.ReportMetric(0, "ns/op") // the wall time of the loop says nothing here
}

// Time from nothing to a control plane whose API server is ready and whose
// controller manager has created the default ServiceAccount.
func BenchmarkControlPlaneStart(b *testing.B) {
	harness.Require(b, harness.NeedsControlPlane...)
	env := harness.New(b)
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		cp := env.ControlPlane(fmt.Sprintf("cp%d", i), harness.ControlPlaneOptions{})
		samples = append(samples, time.Since(start))
		cp.Stop()
	}
	reportMedian(b, samples)
}

// Time to create a site on a LAN and one pod behind it.
func BenchmarkSiteAndPod(b *testing.B) {
	harness.Require(b, harness.NeedsNetwork...)
	env := harness.New(b)
	lan := env.NewLAN("lan")
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		s := env.NewSite(fmt.Sprintf("s%d", i), harness.SiteOptions{LAN: lan, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
		s.AddPod("p", netip.MustParseAddr("10.0.0.5"))
		samples = append(samples, time.Since(start))
	}
	reportMedian(b, samples)
}
