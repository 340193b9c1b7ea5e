package tunnel_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// BenchmarkDataPath measures pod-to-pod TCP throughput (iperf3, 3 s) and
// round-trip time (median of 50 pings) over four paths between the same
// two pods, in one run: the bare veth path (plain routes over the LAN),
// then five turns of a bare wireguard-go tunnel configured by hand with
// wg(8) as the library comes, the same in the agent's batches
// (tunnel.DeviceBatch), and our tunnel with prefix NAT both ways. Our
// tunnel stays up beside the bare devices (its own links and port, its
// routes only for the views), so each turn measures the three one after
// another and the ratios are taken within a turn. It runs once whatever
// b.N is.
func BenchmarkDataPath(b *testing.B) {
	m := newMesh(b, "10.1.0.0/16", "10.2.0.0/16")
	m.env.Require(harness.IPerf3)
	a, c := m.sites[0], m.sites[1]
	// Views that differ from the real ranges, so NAT runs both ways.
	a.views["b"], c.views["a"] = mustPrefix("10.70.0.0/16"), mustPrefix("10.71.0.0/16")
	c.pod.Start("iperf3", "iperf3", "-s")
	time.Sleep(300 * time.Millisecond)

	measure := func(name string, dst netip.Addr) (gbps, rttMs float64) {
		if err := a.pod.Ping(dst); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		out, err := a.pod.Exec(context.Background(), "iperf3", "-c", dst.String(), "-t", "3", "-J")
		if err != nil {
			b.Fatalf("%s: iperf3: %v", name, err)
		}
		if gbps, err = harness.IPerf3Gbps(out); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		rttMs = medianRTT(b, a.pod, dst)
		b.Logf("%-22s %6.2f Gbit/s  rtt median %.3f ms", name, gbps, rttMs)
		return gbps, rttMs
	}

	// Bare veth: route each PodCIDR to the other site over the LAN.
	a.exec(b, "ip", "route", "add", c.PodCIDR.String(), "via", c.Addr.String())
	c.exec(b, "ip", "route", "add", a.PodCIDR.String(), "via", a.Addr.String())
	vethG, vethRTT := measure("bare veth", c.pod.Addr)
	a.exec(b, "ip", "route", "del", c.PodCIDR.String())
	c.exec(b, "ip", "route", "del", a.PodCIDR.String())

	// Ours, with NAT, up for the rest of the run.
	for _, s := range m.sites {
		m.start(s)
		m.apply(s, m.desiredFor(s, m.others(s)...))
	}

	// Bare wireguard-go, by hand, no NAT, on links and a port of its own:
	// as the library comes, and in the agent's batches.
	bareLink := map[*meshSite]string{a: m.env.LinkName("wa"), c: m.env.LinkName("wc")}
	const barePort = 51821
	for _, s := range m.sites {
		b.Cleanup(func() { os.Remove("/var/run/wireguard/" + bareLink[s] + ".sock") })
	}
	bare := func(name string, batch int) (gbps, rttMs float64) {
		for _, pair := range [][2]*meshSite{{a, c}, {c, a}} {
			s, o := pair[0], pair[1]
			link := bareLink[s]
			proc := s.Start("bare-"+s.name, os.Args[0], bareArg, link, strconv.Itoa(batch))
			defer proc.Stop() // stopping a bare device deletes its link and the routes on it
			waitUntil(b, 5*time.Second, "bare device", func() bool {
				_, err := os.Stat("/var/run/wireguard/" + link + ".sock")
				return err == nil
			})
			s.exec(b, "wg", "set", link, "private-key", s.keyFile, "listen-port", fmt.Sprint(barePort),
				"peer", o.pub.String(), "endpoint", netip.AddrPortFrom(o.Addr, barePort).String(), "allowed-ips", o.PodCIDR.String())
			s.exec(b, "ip", "link", "set", link, "mtu", "1420", "up")
			s.waitListeningOn(b, barePort)
			s.exec(b, "ip", "route", "replace", o.PodCIDR.String(), "dev", link)
		}
		return measure(name, c.pod.Addr)
	}
	batchedName := fmt.Sprintf("bare, batches of %d", tunnel.DeviceBatch)
	var wgs, batched, ours, batchedRatios, ourRatios, wgRTTs, ourRTTs, rttRatios []float64
	for range 5 {
		g, rtt := bare("bare wireguard-go", 0)
		bg, _ := bare(batchedName, tunnel.DeviceBatch)
		og, ortt := measure("flotilla (NAT)", a.seenFrom(c))
		wgs, batched, ours = append(wgs, g), append(batched, bg), append(ours, og)
		batchedRatios, ourRatios = append(batchedRatios, bg/g), append(ourRatios, og/g)
		wgRTTs, ourRTTs, rttRatios = append(wgRTTs, rtt), append(ourRTTs, ortt), append(rttRatios, ortt/rtt)
	}
	b.Logf("bare wireguard-go %s Gbit/s; in batches of %d %s Gbit/s, %s of it per turn",
		spread(wgs), tunnel.DeviceBatch, spread(batched), spread(batchedRatios))
	b.Logf("flotilla (NAT) %s Gbit/s, %s of bare per turn; rtt %s ms, %s of bare per turn",
		spread(ours), spread(ourRatios), spread(ourRTTs), spread(rttRatios))

	b.ReportMetric(vethG, "veth-Gbit/s")
	b.ReportMetric(medianOf(wgs), "wg-Gbit/s")
	b.ReportMetric(medianOf(batched), "wg-batched-Gbit/s")
	b.ReportMetric(medianOf(batchedRatios), "batched/wg-throughput")
	b.ReportMetric(medianOf(ours), "ours-Gbit/s")
	b.ReportMetric(medianOf(ourRatios), "ours/wg-throughput")
	b.ReportMetric(vethRTT, "veth-rtt-ms")
	b.ReportMetric(medianOf(wgRTTs), "wg-rtt-ms")
	b.ReportMetric(medianOf(ourRTTs), "ours-rtt-ms")
	b.ReportMetric(medianOf(rttRatios), "ours/wg-rtt")
}

var rttLine = regexp.MustCompile(`time=([0-9.]+) ms`)

func medianRTT(b *testing.B, p *harness.Pod, dst netip.Addr) float64 {
	out, err := p.Exec(context.Background(), "ping", "-n", "-c", "50", "-i", "0.02", dst.String())
	if err != nil {
		b.Fatalf("ping %s: %v", dst, err)
	}
	var rtts []float64
	for _, m := range rttLine.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		rtts = append(rtts, v)
	}
	if len(rtts) == 0 {
		b.Fatalf("no ping replies from %s", dst)
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}

// BenchmarkReconcile measures Apply from an empty tunnel to n peers, and
// adding, removing or re-applying one peer at 1000. Each peer is a
// WireGuard peer, a route and two NAT rules. The tunnel runs inside a
// site's namespace on the benchmark's own thread. Each case reports the
// median of its b.N runs (use -benchtime Nx).
func BenchmarkReconcile(b *testing.B) {
	site, tun, peers := benchTunnel(b, 1001)
	desired := func(n int) tunnel.Desired {
		return tunnel.Desired{Networks: []netip.Prefix{mustPrefix("10.0.0.0/24")}, Peers: peers[:n]}
	}
	apply := func(d tunnel.Desired) {
		if err := site.Do(func() error { return tun.Apply(context.Background(), d) }); err != nil {
			b.Fatal(err)
		}
	}
	// timed runs before(), then times to(), b.N times, and reports the
	// median divided by per.
	timed := func(b *testing.B, before, to tunnel.Desired, per float64, unit string) {
		var runs []time.Duration
		for range b.N {
			apply(before)
			start := time.Now()
			apply(to)
			runs = append(runs, time.Since(start))
		}
		b.ReportMetric(float64(median(runs).Microseconds())/1000/per, unit)
	}
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("from-empty-%d", n), func(b *testing.B) {
			timed(b, desired(0), desired(n), float64(n), "ms/peer")
		})
	}
	b.Run("add-one-at-1000", func(b *testing.B) { timed(b, desired(1000), desired(1001), 1, "ms/op") })
	b.Run("remove-one-at-1000", func(b *testing.B) { timed(b, desired(1001), desired(1000), 1, "ms/op") })
	b.Run("same-state-at-1000", func(b *testing.B) { timed(b, desired(1000), desired(1000), 1, "ms/op") })
}

// benchTunnel starts a userspace tunnel in a fresh site and returns it
// with n distinct peers to apply.
func benchTunnel(b *testing.B, n int) (*harness.Site, *tunnel.Tunnel, []tunnel.Peer) {
	site, tun, _ := siteTunnel(b, tunnel.Config{Logger: benchLogger()})
	return site, tun, manyPeers(b, n)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func manyPeers(b *testing.B, n int) []tunnel.Peer {
	out := make([]tunnel.Peer, n)
	for i := range out {
		k, err := tunnel.GeneratePrivateKey()
		if err != nil {
			b.Fatal(err)
		}
		view := netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + i/256), byte(i % 256), 0}), 24)
		out[i] = tunnel.Peer{
			ClusterID: fmt.Sprintf("peer-%04d", i),
			PublicKey: k.PublicKey(),
			Endpoint:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i / 256), byte(i % 256)}), 51820),
			Views:     []tunnel.View{{Real: mustPrefix("10.0.0.0/24"), As: view}},
			ViewsOfMe: []tunnel.View{{Real: mustPrefix("10.0.0.0/24"), As: mustPrefix("172.16.0.0/24")}},
		}
	}
	return out
}

// benchLogger logs the reconciler's phase timings with FLOTILLA_BENCH_DEBUG=1.
func benchLogger() *slog.Logger {
	if os.Getenv("FLOTILLA_BENCH_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// BenchmarkRestart measures what a restart of the tunnel process costs in
// userspace mode: the time from SIGTERM to the new process having applied
// its state, and the traffic a ping every 10 ms loses across it. Median,
// min and max of b.N restarts (use -benchtime Nx); TestRestartKeepsDataPath
// checks only that traffic resumes.
func BenchmarkRestart(b *testing.B) {
	m := newMesh(b, "10.0.0.0/16", "10.0.0.0/16")
	a, c := m.sites[0], m.sites[1]
	m.applyFullMesh()
	var down, lost []time.Duration
	for range b.N {
		r := restart(b, m, a, c)
		down = append(down, r.downAndBack)
		lost = append(lost, r.lost)
	}
	reportSpread(b, down, "down-and-back")
	reportSpread(b, lost, "traffic-lost")
}

// reportSpread reports the median, min and max of runs in milliseconds.
func reportSpread(b *testing.B, runs []time.Duration, what string) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(median(runs)), "ms-"+what+"-median")
	b.ReportMetric(ms(slices.Min(runs)), "ms-"+what+"-min")
	b.ReportMetric(ms(slices.Max(runs)), "ms-"+what+"-max")
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// spread is median (min to max).
func spread(xs []float64) string {
	return fmt.Sprintf("%.2f (%.2f to %.2f)", medianOf(xs), slices.Min(xs), slices.Max(xs))
}
