package harness_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

// The size of what a cluster pulls and runs: the agent's binary as the
// image holds it (static, -trimpath -ldflags "-s -w", as `make image`
// builds it) and the image tarball (its layer compressed), against the
// binary `make build` makes (with its symbol table and debug data), in
// MB of 10^6 bytes. The sizes do not change from one round to the next:
// one round is enough.
func BenchmarkAgentImageSize(b *testing.B) {
	plain := fileSize(b, harness.Flotilla(b))
	bin := fileSize(b, harness.ImageBinary(b))
	image := fileSize(b, harness.FlotillaImage(b, "flotilla.local/flotilla:size"))
	for b.Loop() {
	}
	mb := func(n int64) float64 { return float64(n) / 1e6 }
	b.ReportMetric(mb(bin), "MB-binary")
	b.ReportMetric(mb(image), "MB-image")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkAgentImageSize: the image's binary %.1f MB (%.0f%% smaller than make build's %.1f MB); the image tarball %.1f MB\n",
		mb(bin), 100*(1-float64(bin)/float64(plain)), mb(plain), mb(image))
}

func fileSize(b *testing.B, path string) int64 {
	b.Helper()
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}
