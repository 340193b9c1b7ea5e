package dashboard

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/observe/graph"
)

// reportOf is a cluster with n peers, all connected, each remapped.
func reportOf(n int) graph.Report {
	r := graph.Report{Self: graph.Self{ID: "00000000-self", Name: "self", Nodes: 10}}
	hs := time.Now().Add(-30 * time.Second)
	for i := range n {
		rx, tx := uint64(i)<<20, uint64(i)<<21
		r.Peers = append(r.Peers, graph.PeerReport{
			ID: fmt.Sprintf("%08d-0000-4000-8000-%012d", i+1, i+1), Name: fmt.Sprintf("cluster-%02d", i+1),
			View: graph.View{Phase: "Connected", Endpoint: fmt.Sprintf("192.0.2.%d:51820", i+1), LastHandshake: &hs,
				ReceiveBytes: &rx, TransmitBytes: &tx,
				Theirs: []graph.NetworkView{{Range: "10.1.0.0/16", As: fmt.Sprintf("10.%d.0.0/16", 100+i)}},
				Mine:   []graph.NetworkView{{Range: "10.1.0.0/16", As: fmt.Sprintf("10.%d.0.0/16", 200+i)}}},
		})
	}
	return r
}

// BenchmarkPage renders the whole page (graph, SVG, table) for a
// cluster of 3 and of 30 peers: the cost of each load and refresh.
func BenchmarkPage(b *testing.B) {
	for _, n := range []int{3, 30} {
		b.Run(fmt.Sprintf("peers-%d", n), func(b *testing.B) {
			r := reportOf(n)
			h := New(func(context.Context) (graph.Report, error) { return r, nil }, nil)
			var runs []time.Duration
			size := 0
			for b.Loop() {
				w := httptest.NewRecorder()
				start := time.Now()
				h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
				runs = append(runs, time.Since(start))
				if w.Code != 200 {
					b.Fatalf("status %d: %s", w.Code, w.Body.String())
				}
				size = w.Body.Len()
			}
			slices.Sort(runs)
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
			b.ReportMetric(us(runs[len(runs)/2]), "µs-median")
			b.ReportMetric(us(runs[0]), "µs-min")
			b.ReportMetric(us(runs[len(runs)-1]), "µs-max")
			b.ReportMetric(float64(size)/1024, "KiB-page")
		})
	}
}
