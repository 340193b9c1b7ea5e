package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// From a peer becoming Connected to its view routed on every node of a
// 10-node cluster (a gateway and nine workers, real nodes; the peer a
// one-node cluster). Each round the admin of the big cluster sets the
// Peer to Deny, waits until no node routes it, and sets it back to
// Accept; the round measures from that Accept to Connected (the Peer's
// phase, as a watcher sees it) and to the view's route on the last of the
// ten nodes. Routes can come before Connected: the data path is applied
// before the first handshake. Target: routes on every node <= 1 s after
// Connected; Liqo's fabric and Submariner's route agent are the anchors.
func BenchmarkFabricRoutes(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	env := harness.New(b)
	pods := netip.MustParsePrefix("10.0.0.0/16")
	cs := federation.OnNodes(b, env, federation.NodeOptions{Clusters: 2, PodCIDR: pods})
	a, peer := cs[0], cs[1]
	names := make([]string, 9)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i+1)
	}
	a.AddWorkers(b, names...)
	federation.WaitPhases(b, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	nodes := append([]*harness.Node{a.Gateway}, a.Workers...)
	peerName := peer.Name // Peers by the peer's cluster name

	var toConnected, toRoutes, afterConnected []time.Duration
	for b.Loop() {
		setNetworking(b, a.Cluster, peerName, v1alpha1.NetworkingDeny)
		waitRoutes(b, nodes, pods, 0, 60*time.Second)
		start := time.Now()
		setNetworking(b, a.Cluster, peerName, v1alpha1.NetworkingAccept)
		var wg sync.WaitGroup
		var connected time.Time
		wg.Add(1)
		go func() {
			defer wg.Done()
			connected = waitConnected(b, a, peerName, 60*time.Second)
		}()
		routed := waitRoutes(b, nodes, pods, 1, 60*time.Second)
		wg.Wait()
		toConnected = append(toConnected, connected.Sub(start))
		toRoutes = append(toRoutes, routed.Sub(start))
		afterConnected = append(afterConnected, max(0, routed.Sub(connected)))
	}
	b.ReportMetric(ms(spreadOf(slices.Clone(afterConnected)).median), "ms-routes-after-connected")
	b.ReportMetric(ms(spreadOf(slices.Clone(toRoutes)).median), "ms-routes-after-accept")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkFabricRoutes nodes=%d: from Accept, Connected %s, routes on every node %s; routes after Connected %s (ms: median, min, max, rounds)\n",
		len(nodes), spreadOf(toConnected), spreadOf(toRoutes), spreadOf(afterConnected))
}

// Pod-to-pod throughput through the fabric and the tunnel, worker to
// worker, against gateway pod to gateway pod in the same run: two
// clusters of a gateway and a worker, a 64 MiB HTTP transfer each way per
// round, the two paths alternating. Target: ratio >= 0.9. WireGuard is
// the userspace one on machines without the kernel module (these), so
// both paths are CPU-bound and other load on the machine shows.
func BenchmarkFabricThroughput(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	env := harness.New(b)
	cs := federation.OnNodes(b, env, federation.NodeOptions{Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Workers: 1})
	federation.WaitPhases(b, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	a, p := cs[0], cs[1]
	wa := federation.RunWeb(b, a, a.Workers[0], "web-w1")
	wp := federation.RunWeb(b, p, p.Workers[0], "web-w1")
	const size = 64 << 20
	var gw, workers, ratios []float64
	for i := 0; b.Loop(); i++ {
		// Each path goes first every other round: what else runs on the
		// machine then weighs on both alike.
		var g, w float64
		if i%2 == 0 {
			g = transferMBps(b, a, a.Web, p, p.Web, size)
			w = transferMBps(b, a, wa, p, wp, size)
		} else {
			w = transferMBps(b, a, wa, p, wp, size)
			g = transferMBps(b, a, a.Web, p, p.Web, size)
		}
		gw, workers, ratios = append(gw, g), append(workers, w), append(ratios, w/g)
	}
	b.ReportMetric(medianOf(ratios), "ratio-median")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkFabricThroughput: gateway pods %s MB/s, worker pods %s MB/s, ratio %s (median [min..max] of %d)\n",
		spreadF(gw), spreadF(workers), spreadF(ratios), len(ratios))
}

// transferMBps has fromPod GET size bytes from toPod by its view and
// returns the rate in MB/s.
func transferMBps(b *testing.B, from *federation.NodeCluster, fromPod corev1.Pod, to *federation.NodeCluster, toPod corev1.Pod, size int) float64 {
	b.Helper()
	dst := federation.ViewOf(b, from.Cluster, to.Cluster, netip.MustParseAddr(toPod.Status.PodIP))
	url := fmt.Sprintf("http://%s:%d/bytes?n=%d", dst, harness.TestServerHTTPPort, size)
	out, err := federation.KubectlTimeout(from.CP, 3*time.Minute, "exec", fromPod.Name, "--", "/testserver", "-discard", "-get", url)
	if err != nil {
		b.Fatalf("%s -> %s: %v", fromPod.Name, dst, err)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		b.Fatalf("testserver -discard printed %q", out)
	}
	n, err1 := strconv.Atoi(f[0])
	secs, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || n != size || secs <= 0 {
		b.Fatalf("transfer of %d bytes from %s: %q", size, dst, out)
	}
	return float64(n) / 1e6 / secs
}

// waitRoutes waits until every node routes at least want views (want 0:
// none) and returns when the last one got there. A view route is one of
// ours (protocol 102, any table) to a range outside the cluster's pod
// network: the tunnel's on the gateway, the fabric's on the others; the
// gateway's routes to the workers' pod blocks do not count.
func waitRoutes(b *testing.B, nodes []*harness.Node, podCIDR netip.Prefix, want int, timeout time.Duration) time.Time {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done := 0
		var counts []string
		for _, n := range nodes {
			routes, err := n.Netlink().RouteListFiltered(netlink.FAMILY_V4,
				&netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: tunnel.DefaultRouteProtocol},
				netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				b.Fatalf("routes of %s: %v", n.NodeName, err)
			}
			views := 0
			for _, r := range routes {
				if dst, ok := netipx(r.Dst); ok && !podCIDR.Overlaps(dst) {
					views++
				}
			}
			if (want == 0 && views == 0) || (want > 0 && views >= want) {
				done++
			}
			counts = append(counts, fmt.Sprintf("%s:%d", n.NodeName, views))
		}
		if done == len(nodes) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("not every node routes %d views within %s: %s", want, timeout, strings.Join(counts, " "))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func netipx(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), bits), ok
}

// waitConnected returns when c's Peer peer was first seen Connected.
func waitConnected(b *testing.B, c *federation.NodeCluster, peer string, timeout time.Duration) time.Time {
	deadline := time.Now().Add(timeout)
	for {
		peers, err := c.Peers(context.Background())
		if err == nil && peers[peer].Status.Phase == v1alpha1.PhaseConnected {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Errorf("Peer %s of %s not Connected within %s", peer, c.Name, timeout)
			return time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func spreadF(fs []float64) string {
	s := slices.Clone(fs)
	slices.Sort(s)
	return fmt.Sprintf("%.2f [%.2f..%.2f]", s[len(s)/2], s[0], s[len(s)-1])
}

func medianOf(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	return s[len(s)/2]
}
