package harness_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// Three sites on one LAN, all with the same PodCIDR: each pod reaches its
// own site, and a multicast datagram from one site reaches the other two.
func TestSitesOnLAN(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsNetwork...)
	var run string
	t.Run("env", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		lan := env.NewLAN("lan")
		cidr := netip.MustParsePrefix("10.0.0.0/16")
		var sites []*harness.Site
		for _, name := range []string{"a", "b", "c"} {
			s := env.NewSite(name, harness.SiteOptions{LAN: lan, PodCIDR: cidr})
			p := s.AddPod("p1", netip.MustParseAddr("10.0.1.5"))
			if err := p.Ping(s.Addr); err != nil {
				t.Errorf("pod of %s to its site: %v", name, err)
			}
			sites = append(sites, s)
		}
		if err := sites[0].Ping(sites[2].Addr); err != nil {
			t.Errorf("site a to site c over the LAN: %v", err)
		}
		assertMulticast(t, sites[0], sites[1:])
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

func assertMulticast(t *testing.T, from *harness.Site, to []*harness.Site) {
	t.Helper()
	group := &net.UDPAddr{IP: net.IPv4(239, 255, 70, 1), Port: 7946}
	var conns []*net.UDPConn
	for _, s := range to {
		var c *net.UDPConn
		err := s.Do(func() error {
			ifi, err := net.InterfaceByName(s.Underlay)
			if err != nil {
				return err
			}
			c, err = net.ListenMulticastUDP("udp4", ifi, group)
			return err
		})
		if err != nil {
			t.Fatalf("join multicast group in %s: %v", s.SiteName, err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	err := from.Do(func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IP(from.Addr.AsSlice())}, group)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello group"))
		return err
	})
	if err != nil {
		t.Fatalf("send multicast from %s: %v", from.SiteName, err)
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		n, src, err := c.ReadFromUDP(buf)
		if err != nil {
			t.Errorf("site %s received no multicast: %v", to[i].SiteName, err)
			continue
		}
		if string(buf[:n]) != "hello group" || !src.IP.Equal(from.Addr.AsSlice()) {
			t.Errorf("site %s got %q from %v", to[i].SiteName, buf[:n], src)
		}
	}
}

// Two sites behind a router reach each other; pods reach their sites and
// answer TCP with the address they see.
func TestSitesBehindRouter(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	rtr := env.NewRouter("wan")
	a := env.NewSite("a", harness.SiteOptions{Router: rtr, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	b := env.NewSite("b", harness.SiteOptions{Router: rtr, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	if err := a.Ping(b.Addr); err != nil {
		t.Fatalf("site a to site b through the router: %v", err)
	}
	pod := a.AddPod("p1", netip.MustParseAddr("10.0.3.4"))
	a.ServeTCP(8080)
	seen, err := pod.TCPExchange(netip.AddrPortFrom(a.Addr, 8080))
	if err != nil {
		t.Fatal(err)
	}
	if seen != pod.Addr {
		t.Fatalf("site saw the pod as %s, want %s", seen, pod.Addr)
	}
}

// A site behind a NAT router, on a routed segment of its own or on a LAN
// behind it (as a cluster's nodes are), reaches a site on the LAN, which
// sees it as the router's address; the site on the LAN cannot reach it
// first.
func TestSiteBehindNATRouter(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsNetwork...)
	for _, tc := range []struct {
		name   string
		behind func(env *harness.Env, nat *harness.NATRouter) harness.SiteOptions
	}{
		{"on a segment of its own", func(env *harness.Env, nat *harness.NATRouter) harness.SiteOptions {
			return harness.SiteOptions{Router: nat.Router}
		}},
		{"on a LAN behind it", func(env *harness.Env, nat *harness.NATRouter) harness.SiteOptions {
			return harness.SiteOptions{LAN: env.NewLANBehind("inside", nat)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := harness.New(t)
			lan := env.NewLAN("lan")
			nat := env.NewNATRouter("nat", lan)
			a := env.NewSite("a", harness.SiteOptions{LAN: lan})
			b := env.NewSite("b", tc.behind(env, nat))
			a.ServeTCP(8080)
			seen, err := b.TCPExchange(netip.AddrPortFrom(a.Addr, 8080))
			if err != nil {
				t.Fatalf("site b behind the NAT to site a on the LAN: %v", err)
			}
			if seen != nat.Addr {
				t.Fatalf("site a saw site b as %s, want the router's LAN address %s", seen, nat.Addr)
			}
			// b reached a, b serves (the router reaches it), and a routes
			// b's segment via the router: only the router's rules keep a
			// out.
			b.ServeTCP(8080)
			c, err := nat.DialContext(t.Context(), "tcp", netip.AddrPortFrom(b.Addr, 8080).String())
			if err != nil {
				t.Fatalf("the router to site b behind it: %v", err)
			}
			c.Close()
			a.MustExec("ip", "route", "add", netip.PrefixFrom(b.Addr, 24).Masked().String(), "via", nat.Addr.String())
			if seen, err := a.TCPExchange(netip.AddrPortFrom(b.Addr, 8080)); err == nil {
				t.Fatalf("site a reached site b behind the NAT (seen as %s)", seen)
			}
		})
	}
}
