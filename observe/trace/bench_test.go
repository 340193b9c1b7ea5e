package trace

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// BenchmarkRun traces between two clusters whose nodes hold n routes
// each besides the fabric's (a CNI's per-node blocks, say): the model's
// share of flotilla trace, reading aside.
func BenchmarkRun(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("routes-%d", n), func(b *testing.B) {
			a, c := fixture()
			for _, cl := range []*Cluster{&a, &c} {
				for i := range cl.Nodes {
					k := cl.Nodes[i].Kernel
					for j := range n {
						k.Routes = append(k.Routes, Route{Table: MainTable, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + j/256), byte(j % 256), 0}), 24), Dev: "eth0", Protocol: 3})
					}
				}
			}
			var runs []time.Duration
			for b.Loop() {
				start := time.Now()
				if r := Run(&a, &c, "client", "server", now); r.Broken != "" {
					b.Fatalf("broken at %s", r.Broken)
				}
				runs = append(runs, time.Since(start))
			}
			slices.Sort(runs)
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
			b.ReportMetric(us(runs[len(runs)/2]), "µs-median")
			b.ReportMetric(us(runs[0]), "µs-min")
			b.ReportMetric(us(runs[len(runs)-1]), "µs-max")
		})
	}
}

// FuzzParseNodeReport: a report from an agent (the peer cluster's too,
// with --peer-context) either decodes or says why, and a trace over what
// decodes does not fail.
func FuzzParseNodeReport(f *testing.F) {
	a, _ := fixture()
	for _, rep := range []NodeReport{
		{Node: "gw-a", Kernel: a.Nodes[0].Kernel, Tunnel: a.Tunnel},
		{Node: "w-a", Kernel: a.Nodes[1].Kernel},
		{Errors: []string{"the tunnel has not started yet"}},
	} {
		raw, err := json.Marshal(rep)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{"kernel":{"routes":[{"table":254}]}}`))
	f.Add([]byte(`{"kernel":{"rules":[{"priority":1,"suppressPrefixlen":-3}]}}`))
	f.Add([]byte(`{"kernel":{"rules":[{"priority":20000,"table":102,"protocol":102,"action":"blackhole"}]}}`))
	f.Add([]byte(`{"kernel":{"rules":[{"priority":20000,"table":102,"protocol":102,"iif":"flotilla0","action":"prohibit"}]}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		rep, err := ParseNodeReport(raw)
		if err != nil {
			return
		}
		// The report stands for each node and gateway in turn.
		for i := range 4 {
			a, b := fixture()
			c := []*Cluster{&a, &b}[i/2]
			c.Nodes[i%2].Kernel = rep.Kernel
			if i%2 == 0 {
				c.Tunnel = rep.Tunnel
			}
			Run(&a, &b, "client", "server", now)
			Run(&a, &b, "10.0.1.5", "10.70.2.7", now)
		}
	})
}
