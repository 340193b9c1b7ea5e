package fabric_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// innerOf and macOf are the overlay's next hop and link address of the
// node at a, as docs/fabric.md gives them.
func innerOf(a netip.Addr) netip.Addr {
	b := a.As4()
	return netip.AddrFrom4([4]byte{240, b[1], b[2], b[3]})
}

func macOf(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x0a, 0x66, b[0], b[1], b[2], b[3]}
}

// A pod on a worker that shares no link with the gateway (a router in
// between) reaches the peer through the overlay, and the peer reaches it,
// each seeing the other's own address, with strict reverse-path filtering
// on both nodes (the kernel checks a forwarded packet's source with the
// output link as input link, so the gateway's rule `iif <tunnel>` finds
// the overlay route). Without the fabric it does not, though the nodes
// reach each other.
func TestOverlayPodReachesPeer(t *testing.T) {
	c := newRoutedCluster(t)
	for _, s := range []*harness.Site{c.gw, c.wk} {
		s.MustExec("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1")
	}
	if err := c.wk.Ping(c.gw.Addr); err != nil {
		t.Fatalf("worker node to the gateway node through the router: %v", err)
	}
	if _, err := c.seen(peerAddr); err == nil {
		t.Fatal("pod reached the peer without the fabric: the test proves nothing")
	}
	c.applyBoth(t)
	c.podAndPeerTalk(t, "through the overlay")
	remove(t, c.wk)
	if _, err := c.seen(peerAddr); err == nil {
		t.Error("pod reached the peer with the worker's fabric removed")
	}
	c.apply(t, c.wk, c.workerDesired())
	if _, err := c.seen(peerAddr); err != nil {
		t.Fatalf("pod to the peer with the worker's fabric back: %v", err)
	}
}

// What the overlay makes on each side: our VXLAN link (our alias, VNI and
// port, no learning, its MAC derived from the node's address, MTU the
// underlay's minus 50), one FDB entry and one permanent neighbour for the
// other end, our routes onlink via the other end's next hop (the worker's
// with the smaller of the tunnel's MTU and the link's), and our rule.
func TestOverlayKernelObjects(t *testing.T) {
	c := newRoutedCluster(t)
	c.wk.MustExec("ip", "link", "set", "wan0", "mtu", "1400")
	c.applyBoth(t)
	proto := netlink.RouteProtocol(tunnel.DefaultRouteProtocol)
	for _, tc := range []struct {
		site      *harness.Site
		other     netip.Addr
		linkMTU   int
		dst       netip.Prefix
		routeMTU  int
		iif       string
		otherName string
	}{
		{c.wk, c.gw.Addr, 1350, view, 1350, "", "gateway"},
		{c.gw, c.wk.Addr, 1450, wkBlock, 0, tunnelLink, "worker"},
	} {
		t.Run(tc.site.SiteName, func(t *testing.T) {
			nl := tc.site.Netlink()
			l, err := nl.LinkByName(fabric.DefaultOverlayLink)
			if err != nil {
				t.Fatalf("overlay link: %v", err)
			}
			vx, ok := l.(*netlink.Vxlan)
			if !ok || vx.VxlanId != fabric.DefaultVNI || vx.Port != fabric.DefaultVXLANPort || vx.Learning || vx.Group != nil ||
				vx.Alias != "flotilla fabric overlay" || vx.MTU != tc.linkMTU || vx.HardwareAddr.String() != macOf(tc.site.Addr).String() || vx.Flags&net.FlagUp == 0 {
				t.Errorf("overlay link: %+v, want vxlan id %d dstport %d nolearning, alias ours, mtu %d, address %s, up",
					l, fabric.DefaultVNI, fabric.DefaultVXLANPort, tc.linkMTU, macOf(tc.site.Addr))
			}
			idx := l.Attrs().Index
			fdb, err := nl.NeighList(idx, unix.AF_BRIDGE)
			if err != nil {
				t.Fatal(err)
			}
			if len(fdb) != 1 || fdb[0].HardwareAddr.String() != macOf(tc.other).String() || !fdb[0].IP.Equal(tc.other.AsSlice()) || fdb[0].State&netlink.NUD_PERMANENT == 0 {
				t.Errorf("FDB of the overlay link: %v, want only %s dst %s (the %s) permanent", fdb, macOf(tc.other), tc.other, tc.otherName)
			}
			neigh, err := nl.NeighList(idx, unix.AF_INET)
			if err != nil {
				t.Fatal(err)
			}
			if len(neigh) != 1 || !neigh[0].IP.Equal(innerOf(tc.other).AsSlice()) || neigh[0].HardwareAddr.String() != macOf(tc.other).String() || neigh[0].State != netlink.NUD_PERMANENT {
				t.Errorf("neighbours on the overlay link: %v, want only %s lladdr %s permanent", neigh, innerOf(tc.other), macOf(tc.other))
			}
			rs := routesOf(t, tc.site)
			if len(rs) != 1 || prefixOf(rs[0].Dst) != tc.dst || !rs[0].Gw.Equal(innerOf(tc.other).AsSlice()) || rs[0].LinkIndex != idx ||
				rs[0].Flags&int(netlink.FLAG_ONLINK) == 0 || rs[0].Protocol != proto || rs[0].MTU != tc.routeMTU {
				t.Errorf("routes in table %d: %v, want only %s via %s dev %s onlink proto %d mtu %d",
					fabric.DefaultTable, rs, tc.dst, innerOf(tc.other), fabric.DefaultOverlayLink, proto, tc.routeMTU)
			}
			rules := rulesOf(t, tc.site)
			if len(rules) != 1 || rules[0].IifName != tc.iif || rules[0].Protocol != uint8(proto) {
				t.Errorf("rules to table %d: %v, want one, iif %q, proto %d", fabric.DefaultTable, rules, tc.iif, proto)
			}
		})
	}
}

// Run puts back what someone removes of the overlay, on events alone: the
// link itself (with its routes), an FDB entry, a neighbour entry.
func TestOverlayRunRepairs(t *testing.T) {
	c := newRoutedCluster(t)
	wkLogs, _ := c.withLogs(t, c.wk)
	gwLogs, _ := c.withLogs(t, c.gw)
	c.applyBoth(t)
	runIn(t, c.wk, c.fabrics[c.wk], wkLogs)
	runIn(t, c.gw, c.fabrics[c.gw], gwLogs)
	vx := fabric.DefaultOverlayLink
	table := fmt.Sprint(fabric.DefaultTable)
	fdbOf := func(s *harness.Site, other netip.Addr) func() error {
		return func() error {
			out, err := s.Exec(context.Background(), "bridge", "fdb", "show", "dev", vx)
			if want := macOf(other).String() + " dst " + other.String(); err != nil || !strings.Contains(string(out), want) {
				return fmt.Errorf("FDB of %s: %s %v, want %q", vx, out, err, want)
			}
			return nil
		}
	}
	routeVia := func(s *harness.Site, dst netip.Prefix, other netip.Addr) func() error {
		return func() error {
			out, err := s.Exec(context.Background(), "ip", "route", "show", dst.String(), "table", table)
			if want := "via " + innerOf(other).String() + " dev " + vx; err != nil || !strings.Contains(string(out), want) {
				return fmt.Errorf("route to %s: %s %v, want %q", dst, out, err, want)
			}
			return fdbOf(s, other)()
		}
	}
	for _, tc := range []struct {
		name   string
		site   *harness.Site
		break_ []string
		back   func() error
	}{
		{"worker's link deleted", c.wk, []string{"ip", "link", "del", vx}, routeVia(c.wk, view, c.gw.Addr)},
		{"worker's FDB entry deleted", c.wk, []string{"bridge", "fdb", "del", macOf(c.gw.Addr).String(), "dev", vx, "dst", c.gw.Addr.String(), "self"},
			fdbOf(c.wk, c.gw.Addr)},
		{"worker's neighbour deleted", c.wk, []string{"ip", "neigh", "del", innerOf(c.gw.Addr).String(), "dev", vx},
			func() error {
				out := c.wk.MustExec("ip", "neigh", "show", "dev", vx)
				if want := innerOf(c.gw.Addr).String() + " lladdr " + macOf(c.gw.Addr).String() + " PERMANENT"; !strings.Contains(out, want) {
					return fmt.Errorf("neighbours: %q, want %q", out, want)
				}
				return nil
			}},
		{"gateway's FDB entry deleted", c.gw, []string{"bridge", "fdb", "del", macOf(c.wk.Addr).String(), "dev", vx, "dst", c.wk.Addr.String(), "self"},
			fdbOf(c.gw, c.wk.Addr)},
		{"gateway's link deleted", c.gw, []string{"ip", "link", "del", vx}, routeVia(c.gw, wkBlock, c.wk.Addr)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.back(); err != nil {
				t.Fatalf("before: %v", err)
			}
			tc.site.MustExec(tc.break_[0], tc.break_[1:]...)
			eventually.Within(t, 10*time.Second, tc.name+", repaired", tc.back)
		})
	}
	if _, err := c.seen(peerAddr); err != nil {
		t.Errorf("pod to the peer after the repairs: %v", err)
	}
}

// Remove leaves nothing of the overlay: each node is as it was before
// the fabric, links and FDB included.
func TestOverlayRemoveLeavesNothing(t *testing.T) {
	c := newRoutedCluster(t)
	before := map[*harness.Site]string{c.gw: state(c.gw), c.wk: state(c.wk)}
	c.applyBoth(t)
	if _, err := c.seen(peerAddr); err != nil {
		t.Fatalf("pod to the peer through the overlay: %v", err)
	}
	for _, s := range []*harness.Site{c.wk, c.gw} {
		if !strings.Contains(state(s), fabric.DefaultOverlayLink) {
			t.Fatalf("%s: no overlay link after apply", s.SiteName)
		}
		remove(t, s)
		if after := state(s); after != before[s] {
			t.Errorf("%s after Remove:\n%s\nwant exactly what was there before the fabric:\n%s", s.SiteName, after, before[s])
		}
		remove(t, s)
	}
}

// A link that is named like ours but not made by us is refused, never
// adopted or deleted, by Apply and by Remove.
func TestOverlayForeignLinkRefused(t *testing.T) {
	c := newRoutedCluster(t)
	vx := fabric.DefaultOverlayLink
	c.wk.MustExec("ip", "link", "add", vx, "type", "vxlan", "id", "7", "dstport", "4789")
	foreign := c.wk.MustExec("ip", "-d", "link", "show", vx)
	f := c.fabric(t, c.wk)
	err := c.wk.Do(func() error { return f.Apply(c.workerDesired()) })
	if err == nil || !strings.Contains(err.Error(), "did not make") {
		t.Fatalf("apply with a foreign link named %s: %v, want an error saying the fabric did not make it", vx, err)
	}
	remove(t, c.wk)
	if after := c.wk.MustExec("ip", "-d", "link", "show", vx); after != foreign {
		t.Errorf("foreign link changed:\nbefore: %s\nafter: %s", foreign, after)
	}
	// Named another way, the overlay works beside it.
	f = c.fabricWith(t, c.wk, fabric.Config{OverlayLink: "flotilla-vx2", VNI: 8})
	c.fabricWith(t, c.gw, fabric.Config{OverlayLink: "flotilla-vx2", VNI: 8})
	c.apply(t, c.gw, c.gatewayDesired())
	if err := c.wk.Do(func() error { return f.Apply(c.workerDesired()) }); err != nil {
		t.Fatalf("apply with another link name: %v", err)
	}
	if _, err := c.seen(peerAddr); err != nil {
		t.Errorf("pod to the peer through flotilla-vx2: %v", err)
	}
}

// In a cluster where one worker shares a link with the gateway and
// another is behind a router, the first gets direct routes and the second
// the overlay, and pods on both reach the peer and are reached.
func TestOverlayMixedCluster(t *testing.T) {
	c := newRoutedCluster(t)
	// Worker a shares a link with the gateway: a veth between them, over
	// which each reaches the other's node address directly.
	a := c.env.NewSite("wa", harness.SiteOptions{Router: c.wan, PodCIDR: netip.MustParsePrefix("10.0.2.0/24")})
	aPod := a.AddPod("p", netip.MustParseAddr("10.0.2.5"))
	c.gw.MustExec("ip", "link", "add", "sh0", "type", "veth", "peer", "name", "sh1")
	c.gw.MustExec("ip", "link", "set", "sh1", "netns", a.Name)
	c.gw.MustExec("ip", "link", "set", "sh0", "up")
	a.MustExec("ip", "link", "set", "sh1", "up")
	c.gw.MustExec("ip", "route", "add", a.Addr.String()+"/32", "dev", "sh0")
	a.MustExec("ip", "route", "add", c.gw.Addr.String()+"/32", "dev", "sh1")

	gw := c.gatewayDesired()
	gw.Nodes = append(gw.Nodes, fabric.Node{Addr: a.Addr, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}})
	c.apply(t, c.gw, gw)
	c.apply(t, c.wk, c.workerDesired())
	wa := c.workerDesired()
	wa.Addr = a.Addr
	c.apply(t, a, wa)

	for _, p := range []*harness.Pod{c.pod, aPod} {
		from, err := p.TCPExchange(netip.AddrPortFrom(peerAddr, port))
		if err != nil || from != p.Addr {
			t.Errorf("pod %s to the peer: seen as %s, %v; want its own address", p.Addr, from, err)
		}
		p.ServeTCP(port)
		if from, err := c.peer.TCPExchange(netip.AddrPortFrom(p.Addr, port)); err != nil || from != peerAddr {
			t.Errorf("peer to pod %s: seen as %s, %v; want %s", p.Addr, from, err, peerAddr)
		}
	}
	routes := c.gw.MustExec("ip", "route", "show", "table", fmt.Sprint(fabric.DefaultTable))
	for _, want := range []string{
		"10.0.2.0/24 via " + a.Addr.String() + " dev sh0 proto 102",
		"10.0.1.0/24 via " + innerOf(c.wk.Addr).String() + " dev " + fabric.DefaultOverlayLink + " proto 102 onlink",
	} {
		if !strings.Contains(routes, want) {
			t.Errorf("gateway's routes:\n%s\nwant %q", routes, want)
		}
	}
	if out := a.MustExec("ip", "route", "show", "table", fmt.Sprint(fabric.DefaultTable)); !strings.Contains(out, "via "+c.gw.Addr.String()+" dev sh1") {
		t.Errorf("on-link worker's routes: %s, want via %s dev sh1", out, c.gw.Addr)
	}
	if _, err := a.Netlink().LinkByName(fabric.DefaultOverlayLink); err == nil {
		t.Errorf("on-link worker has an overlay link")
	}
}
