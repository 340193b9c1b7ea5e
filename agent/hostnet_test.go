package agent

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/harness"
)

// gatewaySite is a gateway's network namespace on a LAN, with a second
// interface "eth1" that is up and holds the addresses given.
func gatewaySite(t *testing.T, addrs ...string) *harness.Site {
	t.Helper()
	env := harness.New(t)
	site := env.NewSite("gw", harness.SiteOptions{LAN: env.NewLAN("lan")})
	addLink(t, site, "eth1", true, addrs...)
	return site
}

func addAddr(t *testing.T, site *harness.Site, link, addr string) {
	t.Helper()
	l, err := site.Netlink().LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(addr)
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = 0x80 // IFA_F_NODAD: usable at once
	}
	if err := site.Netlink().AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", addr, link, err)
	}
}

// addLink adds an interface (one end of a veth pair whose other end, with
// no address, stays in the namespace) holding addrs.
func addLink(t *testing.T, site *harness.Site, name string, up bool, addrs ...string) {
	t.Helper()
	nl := site.Netlink()
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatalf("add link %s: %v", name, err)
	}
	for _, n := range []string{name + "p", name} {
		l, err := nl.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if up {
			if err := nl.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, a := range addrs {
		addAddr(t, site, name, a)
	}
}

// connectedIn runs connectedNetworks inside the site's namespace.
func connectedIn(site *harness.Site, skip string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := site.Do(func() (err error) {
		out, err = connectedNetworks(skip)
		return err
	})
	return out, err
}

// The node's networks are the prefixes of the addresses on its up
// interfaces; loopback, link-local addresses, down interfaces and our
// WireGuard link do not count.
func TestConnectedNetworks(t *testing.T) {
	harness.Require(t, harness.Root)
	site := gatewaySite(t, "192.168.0.1/16", "10.0.0.5/32", "169.254.3.3/16", "fd00:1::1/64")
	addLink(t, site, "down0", false, "10.9.0.1/24")
	addLink(t, site, "flo-wg", true, "10.8.0.1/24")
	got, err := connectedIn(site, "flo-wg")
	if err != nil {
		t.Fatal(err)
	}
	want := prefixes(netip.PrefixFrom(site.Addr, 24).Masked().String(), "192.168.0.0/16", "10.0.0.5/32", "fd00:1::/64")
	slices.SortFunc(got, comparePrefixes)
	slices.SortFunc(want, comparePrefixes)
	if !slices.Equal(got, want) {
		t.Fatalf("connected networks %v, want %v", got, want)
	}
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// An address that appears on the node while the agent runs moves the
// views it covers: the host's address events are watched.
func TestNewNodeNetworkMovesViews(t *testing.T) {
	harness.Require(t, harness.Root)
	site := gatewaySite(t)
	ledger := openLedger(t)
	const peer = "peer-b"
	theirs := netip.MustParsePrefix("172.31.0.0/24")
	if v, err := ledger.ViewOf(peer, theirs); err != nil || v != theirs {
		t.Fatalf("view of %s: %v %v, want itself", theirs, v, err)
	}
	locals := &localNetworks{
		log: quietLog(), ledger: ledger, gateway: site.Addr, changed: make(chan struct{}, 1),
		cluster:   []ipam.LocalNetwork{{Range: netip.MustParsePrefix("10.244.0.0/16"), Kind: ipam.PodNetwork}},
		connected: func() ([]netip.Prefix, error) { return connectedIn(site, "flo-wg") },
		nodes:     func() []netip.Prefix { return nil },
	}
	if _, err := locals.update(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	subscribed := make(chan struct{}, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Subscribed in the namespace; it signals once right away.
		site.Do(func() error {
			return watchHostNetworks(ctx, quietLog(), func() {
				select {
				case subscribed <- struct{}{}:
				default:
				}
				locals.notify()
			})
		})
	}()
	<-subscribed
	moved := make(chan struct{}, 16)
	wg.Add(1)
	go func() { defer wg.Done(); locals.run(ctx, func() { moved <- struct{}{} }) }()

	addAddr(t, site, "eth1", "172.31.0.1/24")
	<-moved
	v, err := ledger.ViewOf(peer, theirs)
	if err != nil {
		t.Fatal(err)
	}
	if v.Overlaps(theirs) {
		t.Fatalf("view %s still overlaps the node's new network %s", v, theirs)
	}
}
