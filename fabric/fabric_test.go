package fabric_test

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
	"github.com/vishvananda/netlink"
)

// A pod on a worker node reaches a peer's pod through the gateway node,
// and the peer reaches it, each seeing the other's address unchanged.
// Both halves are needed: without the worker's routes, or without the
// gateway's, it fails.
func TestPodOnWorkerReachesPeer(t *testing.T) {
	c := newCluster(t)
	c.applyBoth(t)
	c.podAndPeerTalk(t, "with the fabric")

	remove(t, c.wk)
	if _, err := c.seen(peerAddr); err == nil {
		t.Error("pod reached the peer with the worker's fabric removed")
	}
	c.apply(t, c.wk, c.workerDesired())
	if _, err := c.seen(peerAddr); err != nil {
		t.Fatalf("pod to the peer with the worker's fabric back: %v", err)
	}
	remove(t, c.gw)
	if _, err := c.seen(peerAddr); err == nil {
		t.Error("pod reached the peer with the gateway's fabric removed (the gateway had no way back to the worker's block)")
	}
}

// What the fabric makes: on the worker, the view via the gateway with our
// protocol and the tunnel's MTU, and a rule to our table; on the gateway,
// the worker's block via the worker (not its own block), and a rule for
// what arrives from the tunnel.
func TestKernelObjects(t *testing.T) {
	c := newCluster(t)
	c.applyBoth(t)
	proto := netlink.RouteProtocol(tunnel.DefaultRouteProtocol)

	wk := routesOf(t, c.wk)
	if len(wk) != 1 || prefixOf(wk[0].Dst) != view || !wk[0].Gw.Equal(net.IP(c.gw.Addr.AsSlice())) || wk[0].Protocol != proto || wk[0].MTU != 1420 {
		t.Errorf("worker's routes in table %d: %v, want %s via %s proto %d mtu 1420", fabric.DefaultTable, wk, view, c.gw.Addr, proto)
	}
	gw := routesOf(t, c.gw)
	if len(gw) != 1 || prefixOf(gw[0].Dst) != wkBlock || !gw[0].Gw.Equal(net.IP(c.wk.Addr.AsSlice())) || gw[0].Protocol != proto {
		t.Errorf("gateway's routes in table %d: %v, want only %s via %s proto %d", fabric.DefaultTable, gw, wkBlock, c.wk.Addr, proto)
	}
	for _, tc := range []struct {
		site *harness.Site
		iif  string
	}{{c.wk, ""}, {c.gw, tunnelLink}} {
		rules := rulesOf(t, tc.site)
		if len(rules) != 1 || rules[0].Priority != fabric.DefaultRulePriority || rules[0].IifName != tc.iif || rules[0].Protocol != uint8(proto) {
			t.Errorf("%s: rules to table %d: %v, want one at priority %d, iif %q, proto %d", tc.site.SiteName, fabric.DefaultTable, rules, fabric.DefaultRulePriority, tc.iif, proto)
		}
	}
}

func routesOf(t *testing.T, s *harness.Site) []netlink.Route {
	t.Helper()
	rs, err := s.Netlink().RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: fabric.DefaultTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func rulesOf(t *testing.T, s *harness.Site) []netlink.Rule {
	t.Helper()
	rs, err := s.Netlink().RuleListFiltered(netlink.FAMILY_V4, &netlink.Rule{Table: fabric.DefaultTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

// Input the fabric cannot route is refused with an error that says what
// is wrong, and nothing of what was applied before changes.
func TestBadInputRefused(t *testing.T) {
	c := newCluster(t)
	c.applyBoth(t)
	// A gateway behind a router: the worker reaches 203.0.113.0/24 via
	// the gateway node, so the address is not on a connected network and
	// needs the overlay.
	c.wk.MustExec("ip", "route", "add", "203.0.113.0/24", "via", c.gw.Addr.String())
	routed := netip.MustParseAddr("203.0.113.7")
	good := c.workerDesired()
	for _, tc := range []struct {
		name string
		edit func(d *fabric.Desired)
		want string
	}{
		{"ipv6 view", func(d *fabric.Desired) { d.Views = append(d.Views, netip.MustParsePrefix("fd00::/64")) }, "not IPv4"},
		{"non-canonical view", func(d *fabric.Desired) { d.Views = append(d.Views, netip.MustParsePrefix("10.71.0.1/16")) }, "did you mean 10.71.0.0/16"},
		{"overlapping views", func(d *fabric.Desired) { d.Views = append(d.Views, netip.MustParsePrefix("10.70.8.0/24")) }, "overlaps"},
		{"same view twice", func(d *fabric.Desired) { d.Views = append(d.Views, view) }, "overlaps"},
		{"overlay without own address", func(d *fabric.Desired) { d.Gateway, d.Addr = routed, netip.Addr{} }, "needs this node's own address"},
		{"overlay with another's address", func(d *fabric.Desired) { d.Gateway, d.Addr = routed, c.gw.Addr }, "not an address of this node"},
		{"view in the overlay range", func(d *fabric.Desired) {
			d.Gateway, d.Views = routed, append(d.Views, netip.MustParsePrefix("240.1.0.0/16"))
		}, "overlaps the overlay range"},
		{"gateway unreachable", func(d *fabric.Desired) { d.Gateway = netip.MustParseAddr("192.0.2.7") }, "not on a network this node is connected to"},
		{"gateway is this node", func(d *fabric.Desired) { d.Gateway = c.wk.Addr }, "this node's own"},
		{"gateway inside a view", func(d *fabric.Desired) { d.Gateway = netip.MustParseAddr("10.70.0.1") }, "inside view"},
		{"ipv6 gateway", func(d *fabric.Desired) { d.Gateway = netip.MustParseAddr("fd00::1") }, "IPv4"},
		{"no role", func(d *fabric.Desired) { d.Role = "" }, "role"},
		{"gateway without tunnel link", func(d *fabric.Desired) { d.Role = fabric.Gateway }, "tunnel interface"},
		{"mtu too small", func(d *fabric.Desired) { d.MTU = 500 }, "mtu 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := state(c.wk)
			d := good
			d.Views = append([]netip.Prefix(nil), good.Views...)
			tc.edit(&d)
			f := c.fabric(t, c.wk)
			err := c.wk.Do(func() error { return f.Apply(d) })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("apply: %v, want an error containing %q", err, tc.want)
			}
			if after := state(c.wk); after != before {
				t.Errorf("refused apply changed the node:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	if _, err := c.seen(peerAddr); err != nil {
		t.Errorf("the applied fabric stopped working after refused input: %v", err)
	}
}

// A Config that would take someone else's routes is refused.
func TestBadConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		cfg  fabric.Config
		want string
	}{
		{fabric.Config{Table: 254}, "table of its own"},
		{fabric.Config{RouteProtocol: 4}, "static"},
		{fabric.Config{RulePriority: 32766}, "before the main table"},
		{fabric.Config{VNI: 1 << 24}, "VNI"},
		{fabric.Config{VXLANPort: 70000}, "VXLAN port"},
		{fabric.Config{OverlayRange: netip.MustParsePrefix("192.0.0.0/2")}, "overlay range"},
		{fabric.Config{OverlayRange: netip.MustParsePrefix("240.0.0.1/8")}, "overlay range"},
		{fabric.Config{OverlayLink: "a-name-too-long-for-a-link"}, "overlay link name"},
	} {
		t.Run(fmt.Sprint(tc.cfg), func(t *testing.T) {
			if _, err := fabric.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%+v): %v, want an error containing %q", tc.cfg, err, tc.want)
			}
			if err := fabric.Remove(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Remove(%+v): %v, want an error containing %q", tc.cfg, err, tc.want)
			}
		})
	}
}

// A route to a view that someone else put in our table (another
// protocol) is not replaced: Apply says so, and the route stays.
func TestForeignRouteToViewRefused(t *testing.T) {
	c := newCluster(t)
	table := fmt.Sprint(fabric.DefaultTable)
	c.wk.MustExec("ip", "route", "add", view.String(), "dev", "lan0", "table", table, "proto", "static")
	f := c.fabric(t, c.wk)
	err := c.wk.Do(func() error { return f.Apply(c.workerDesired()) })
	if err == nil || !strings.Contains(err.Error(), "not made by us") {
		t.Errorf("apply over a foreign route to the view: %v, want an error naming the route not made by us", err)
	}
	if out := c.wk.MustExec("ip", "route", "show", view.String(), "table", table); !strings.Contains(out, "proto static") {
		t.Errorf("foreign route replaced: %q", out)
	}
}
