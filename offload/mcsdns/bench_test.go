package mcsdns

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// BenchmarkClustersetDNS measures the running server against a real API
// server holding 100 ClusterSetIP ServiceImports and 10 headless ones of
// 2 clusters x 10 endpoints:
//   - query: one client over UDP, A of a ClusterSetIP name; latency
//     median/min/max and queries/s;
//   - headless-srv: the SRV of a headless Service (20 targets, additional
//     addresses), over TCP;
//   - parallel: GOMAXPROCS clients over UDP, queries/s;
//   - change: a ServiceImport's ClusterSetIP updated in the API until the
//     server answers the new address (watch to answer), median/min/max.
//
// Each iteration is a batch (of queries, of changes), so that make bench's
// -benchtime 5x still gives figures.
func BenchmarkClustersetDNS(b *testing.B) {
	const batch, changes = 1000, 20
	// One client asks as fast as the server answers, far past the limit
	// of one client's queries (DefaultClientRate): what is measured is
	// the server's cost of an answer, so the limit is lifted here, and
	// TestClientRateLimit holds it.
	e := newDNSEnv(b, func(c *Config) { c.ClientRate = math.MaxFloat64 })
	e.installMCSCRDs(b)
	e.create(b, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	for i := range 100 {
		e.create(b, clusterSetImport("shop", fmt.Sprintf("web%d", i), fmt.Sprintf("10.100.%d.%d", i/250, i%250+1)))
	}
	for i := range 10 {
		name := fmt.Sprintf("db%d", i)
		e.create(b, headlessImport("shop", name))
		for j, cluster := range []string{clusterA, clusterB} {
			var eps []endpoint
			for k := range 10 {
				eps = append(eps, endpoint{hostname: fmt.Sprintf("db-%d", k), addrs: []string{fmt.Sprintf("10.%d.%d.%d", j+1, i, k+1)}})
			}
			e.create(b, importedSlice("shop", name, fmt.Sprintf("%s-%d", name, j), cluster, discoveryv1.AddressTypeIPv4, eps...))
		}
	}
	e.answers(b, "udp", "web99.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "A 10.100.0.100")
	srvName := "_db._tcp.db9.shop.svc.clusterset.local."
	poll(b, "headless db9 complete", func(context.Context) error {
		r, err := e.ask("tcp", srvName, dns.TypeSRV) // 20 targets: more than 512 bytes
		if err == nil && len(r.Answer) != 20 {
			err = fmt.Errorf("%d SRV records", len(r.Answer))
		}
		return err
	})

	b.Run("query", func(b *testing.B) {
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
		conn, err := c.Dial(e.srv.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		var samples []time.Duration
		start := time.Now()
		for b.Loop() {
			for i := range batch {
				req := new(dns.Msg)
				req.SetQuestion(fmt.Sprintf("web%d.shop.svc.clusterset.local.", i%100), dns.TypeA)
				r, rtt, err := c.ExchangeWithConn(req, conn)
				if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
					b.Fatalf("query %d: %v %v", i, r, err)
				}
				samples = append(samples, rtt)
			}
		}
		reportLatency(b, samples, time.Since(start))
	})
	b.Run("headless-srv", func(b *testing.B) {
		c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
		conn, err := c.Dial(e.srv.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		var samples []time.Duration
		start := time.Now()
		for b.Loop() {
			for i := range batch {
				req := new(dns.Msg)
				req.SetQuestion(fmt.Sprintf("_db._tcp.db%d.shop.svc.clusterset.local.", i%10), dns.TypeSRV)
				r, rtt, err := c.ExchangeWithConn(req, conn)
				if err != nil || len(r.Answer) != 20 || len(r.Extra) != 20 {
					b.Fatalf("query %d: %v %v", i, r, err)
				}
				samples = append(samples, rtt)
			}
		}
		reportLatency(b, samples, time.Since(start))
	})
	b.Run("parallel", func(b *testing.B) {
		var n atomic.Int64
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
			conn, err := c.Dial(e.srv.Addr().String())
			if err != nil {
				b.Error(err)
				return
			}
			defer conn.Close()
			for pb.Next() {
				for range batch {
					i := n.Add(1)
					req := new(dns.Msg)
					req.SetQuestion(fmt.Sprintf("web%d.shop.svc.clusterset.local.", i%100), dns.TypeA)
					if r, _, err := c.ExchangeWithConn(req, conn); err != nil || r.Rcode != dns.RcodeSuccess {
						b.Errorf("query: %v %v", r, err)
						return
					}
				}
			}
		})
		b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "queries/s")
		b.ReportMetric(0, "ns/op")
	})
	b.Run("change", func(b *testing.B) {
		var samples []time.Duration
		i := 0
		for b.Loop() {
			for range changes {
				i++
				var imp mcsv1alpha1.ServiceImport
				if err := e.c.Get(b.Context(), client.ObjectKey{Namespace: "shop", Name: "web0"}, &imp); err != nil {
					b.Fatal(err)
				}
				want := net.IPv4(10, 101, byte(i/250), byte(i%250+1)).String()
				imp.Spec.IPs = []string{want}
				start := time.Now()
				if err := e.c.Update(b.Context(), &imp); err != nil {
					b.Fatal(err)
				}
				for {
					r, err := e.ask("udp", "web0.shop.svc.clusterset.local.", dns.TypeA)
					if err == nil && len(r.Answer) == 1 && r.Answer[0].(*dns.A).A.String() == want {
						break
					}
					if time.Since(start) > time.Minute { // a broken run, not a target
						b.Fatalf("web0 never answered %s: %v %v", want, r, err)
					}
					time.Sleep(200 * time.Microsecond)
				}
				samples = append(samples, time.Since(start))
			}
		}
		reportLatency(b, samples, 0)
	})
}

// reportLatency prints the samples' median, min and max in microseconds, and
// queries/s over elapsed when given.
func reportLatency(b *testing.B, samples []time.Duration, elapsed time.Duration) {
	b.Helper()
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	b.ReportMetric(us(samples[len(samples)/2]), "us-median")
	b.ReportMetric(us(samples[0]), "us-min")
	b.ReportMetric(us(samples[len(samples)-1]), "us-max")
	if elapsed > 0 {
		b.ReportMetric(float64(len(samples))/elapsed.Seconds(), "queries/s")
	}
	b.ReportMetric(0, "ns/op")
}
