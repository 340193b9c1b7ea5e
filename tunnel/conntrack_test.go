package tunnel_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// holdTCP opens a TCP connection from `from` to a listener it starts in
// `to`, and keeps both ends open until the test ends: an established flow
// whose conntrack entry stays.
func holdTCP(t *testing.T, from, to *harness.Netns, dst netip.AddrPort) {
	t.Helper()
	l, err := to.Listen("tcp", fmt.Sprintf(":%d", dst.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	waitUntil(t, 15*time.Second, "tcp connection to "+dst.String(), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := from.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return false
		}
		t.Cleanup(func() { c.Close() })
		return true
	})
	c := <-accepted
	t.Cleanup(func() { c.Close() })
}

// flowTo reports whether the site's conntrack table holds a TCP flow whose
// original destination is dst.
func flowTo(t *testing.T, s *meshSite, dst netip.AddrPort) bool {
	t.Helper()
	flows, err := s.Netlink().ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatalf("site %s: list conntrack: %v", s.name, err)
	}
	for _, f := range flows {
		a, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if f.Forward.Protocol == unix.IPPROTO_TCP && a.Unmap() == dst.Addr() && f.Forward.DstPort == dst.Port() {
			return true
		}
	}
	return false
}

// A view that is remapped takes the flows through it out of the conntrack
// table, so none keeps using an address that may now be someone else's;
// a flow that has nothing to do with the view stays.
func TestRemappedViewFlushesItsFlows(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	m.applyFullMesh()
	viaTunnel := netip.AddrPortFrom(a.seenFrom(b), 7072)
	holdTCP(t, a.pod.Netns, b.pod.Netns, viaTunnel)
	unrelated := netip.AddrPortFrom(a.pod.Addr, 7073)
	holdTCP(t, a.Netns, a.pod.Netns, unrelated)
	for _, f := range []netip.AddrPort{viaTunnel, unrelated} {
		if !flowTo(t, a, f) {
			t.Fatalf("no conntrack entry for the flow to %s before the remap", f)
		}
	}

	a.views["b"] = mustPrefix("10.75.0.0/16")
	m.apply(a, m.desiredFor(a, b))
	if flowTo(t, a, viaTunnel) {
		t.Errorf("the flow to %s through the remapped view is still in the conntrack table", viaTunnel)
	}
	if !flowTo(t, a, unrelated) {
		t.Errorf("the unrelated flow to %s was flushed too", unrelated)
	}
}

// udpFlow is a conntrack entry of a UDP flow from src to dst, answered
// from dst to replyTo (src as translated).
func udpFlow(src, dst, replyTo string) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 300,
		Forward: netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: net.ParseIP(src).To4(), DstIP: net.ParseIP(dst).To4(), SrcPort: 4000, DstPort: 5000},
		Reverse: netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: net.ParseIP(dst).To4(), DstIP: net.ParseIP(replyTo).To4(), SrcPort: 5000, DstPort: 4000}}
}

// The entries a remap deletes are counted in
// flotilla_tunnel_conntrack_flushed_total.
func TestFlushedFlowsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	site, tun, _ := siteTunnel(t, tunnel.Config{Metrics: reg})
	d := onePeer(t, mustPrefix("10.80.0.0/24"))
	var flows []*netlink.ConntrackFlow
	if err := site.Do(func() error {
		if err := tun.Apply(context.Background(), d); err != nil {
			return err
		}
		for _, f := range []*netlink.ConntrackFlow{
			udpFlow("10.0.0.5", "10.80.0.7", "10.71.0.5"), // to the peer, through the view
			udpFlow("10.0.0.5", "10.99.0.7", "10.0.0.5"),  // elsewhere
		} {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
				return fmt.Errorf("create conntrack entry %s: %w", f.Forward.DstIP, err)
			}
		}
		d.Peers[0].Views[0].As = mustPrefix("10.81.0.0/24")
		if err := tun.Apply(context.Background(), d); err != nil {
			return err
		}
		var err error
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, f := range flows {
		left = append(left, f.Forward.DstIP.String())
	}
	if !slices.Equal(left, []string{"10.99.0.7"}) {
		t.Errorf("conntrack entries after the remap go to %v, want only 10.99.0.7", left)
	}
	if got := plainCounter(t, reg, "flotilla_tunnel_conntrack_flushed_total"); got != 1 {
		t.Errorf("flotilla_tunnel_conntrack_flushed_total = %v, want 1", got)
	}
}

// plainCounter returns the value of a counter without labels, 0 if absent.
func plainCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
