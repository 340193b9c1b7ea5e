package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// Underlay addresses come from the benchmarking ranges of RFC 2544
// (198.18.0.0/15), which no real network routes: LANs from 198.18.0.0/16,
// routed segments from 198.19.0.0/16, one /24 each.
const (
	lanOctet2    = 18
	routedOctet2 = 19
	// podGateway is the address pods use as their default gateway; it sits
	// on the site's end of every pod's veth.
	podGateway4 = "169.254.1.1"
	podGateway6 = "fe80::1"
)

var shortName = regexp.MustCompile(`^[a-z][a-z0-9]{0,9}$`)

func checkName(kind, name string) error {
	if !shortName.MatchString(name) {
		return fmt.Errorf("%s name %q: want 1-10 lowercase letters and digits, starting with a letter", kind, name)
	}
	return nil
}

// LAN is a broadcast domain: a bridge in its own namespace. Multicast
// (mDNS) crosses it.
type LAN struct {
	ns     *Netns
	Prefix netip.Prefix

	mu      sync.Mutex
	members int
	// gateway is the router's address on a LAN behind it
	// (NewLANBehind), every later member's default route; invalid
	// otherwise.
	gateway netip.Addr
	// cutReady: the partition table of Cut exists.
	cutReady bool
}

// NewLAN creates a LAN.
func (e *Env) NewLAN(name string) *LAN {
	e.t.Helper()
	l, err := e.newLAN(name)
	if err != nil {
		e.fatalf("LAN %s: %v", name, err)
	}
	return l
}

func (e *Env) newLAN(name string) (*LAN, error) {
	if err := checkName("LAN", name); err != nil {
		return nil, err
	}
	seg := e.nextSegment()
	ns, err := e.newNetns(name)
	if err != nil {
		return nil, err
	}
	snooping := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}, MulticastSnooping: &snooping}
	if err := ns.nl.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("create bridge: %w", err)
	}
	if err := ns.nl.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bridge up: %w", err)
	}
	return &LAN{ns: ns, Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, lanOctet2, byte(seg), 0}), 24)}, nil
}

// nextAddr hands out the next member address of the LAN.
func (l *LAN) nextAddr() (netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextAddrLocked()
}

func (l *LAN) nextAddrLocked() (netip.Addr, error) {
	l.members++
	if l.members > 250 {
		return netip.Addr{}, errors.New("LAN is full (250 members)")
	}
	base := l.Prefix.Addr().As4()
	base[3] = byte(l.members)
	return netip.AddrFrom4(base), nil
}

// attach connects n to the LAN with a veth, ifname inside n and farName
// on the bridge, and gives n's end the next address of the LAN. Nodes
// starting at once attach one at a time: they share the LAN's netlink
// handle.
func (l *LAN) attach(n *Netns, ifname, farName string) (netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	addr, err := l.nextAddrLocked()
	if err != nil {
		return addr, err
	}
	if err := n.nl.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ifname},
		PeerName:      farName,
		PeerNamespace: netlink.NsFd(l.ns.handle),
	}); err != nil {
		return addr, fmt.Errorf("create veth %s/%s: %w", ifname, farName, err)
	}
	link, err := n.nl.LinkByName(ifname)
	if err != nil {
		return addr, err
	}
	if err := n.nl.AddrAdd(link, addrOf(netip.PrefixFrom(addr, l.Prefix.Bits()))); err != nil {
		return addr, fmt.Errorf("address %s: %w", addr, err)
	}
	if err := n.nl.LinkSetUp(link); err != nil {
		return addr, err
	}
	peer, err := l.ns.nl.LinkByName(farName)
	if err != nil {
		return addr, err
	}
	br, err := l.ns.nl.LinkByName("br0")
	if err != nil {
		return addr, err
	}
	if err := l.ns.nl.LinkSetMaster(peer, br); err != nil {
		return addr, fmt.Errorf("attach %s to bridge: %w", farName, err)
	}
	if err := l.ns.nl.LinkSetUp(peer); err != nil {
		return addr, err
	}
	if l.gateway.IsValid() {
		if err := n.nl.RouteAdd(&netlink.Route{Gw: net.IP(l.gateway.AsSlice()), LinkIndex: link.Attrs().Index}); err != nil {
			return addr, fmt.Errorf("default route via %s: %w", l.gateway, err)
		}
	}
	return addr, nil
}

// Router joins sites on routed segments of their own (one /24 each, the
// router at .1). It forwards unicast but not multicast, so sites behind it
// can reach each other but not discover each other with mDNS.
type Router struct {
	ns *Netns
}

// NewRouter creates a router.
func (e *Env) NewRouter(name string) *Router {
	e.t.Helper()
	r, err := e.newRouter(name)
	if err != nil {
		e.fatalf("router %s: %v", name, err)
	}
	return r
}

func (e *Env) newRouter(name string) (*Router, error) {
	if err := checkName("router", name); err != nil {
		return nil, err
	}
	ns, err := e.newNetns(name)
	if err != nil {
		return nil, err
	}
	if err := ns.sysctl("net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	return &Router{ns: ns}, nil
}

// SiteOptions say how a site is attached. Exactly one of LAN and Router.
type SiteOptions struct {
	LAN    *LAN
	Router *Router
	// PodCIDR is the cluster's pod network; pods added to the site take
	// addresses from it. Several sites may use the same PodCIDR.
	PodCIDR netip.Prefix
}

// Site is a cluster's gateway node: a network namespace on an underlay
// (interface "lan0" on a LAN, "wan0" on a routed segment) that forwards
// between its pods and the underlay.
type Site struct {
	*Netns
	SiteName string
	// Addr is the site's underlay address.
	Addr netip.Addr
	// Underlay is the name of the underlay interface.
	Underlay string
	PodCIDR  netip.Prefix

	pods int
}

// NewSite creates a site.
func (e *Env) NewSite(name string, opts SiteOptions) *Site {
	e.t.Helper()
	s, err := e.newSite(name, opts)
	if err != nil {
		e.fatalf("site %s: %v", name, err)
	}
	return s
}

func (e *Env) newSite(name string, opts SiteOptions) (*Site, error) {
	if err := checkName("site", name); err != nil {
		return nil, err
	}
	if (opts.LAN == nil) == (opts.Router == nil) {
		return nil, errors.New("want exactly one of LAN and Router in SiteOptions")
	}
	if opts.PodCIDR.IsValid() && opts.PodCIDR != opts.PodCIDR.Masked() {
		return nil, fmt.Errorf("PodCIDR %s is not canonical (want %s)", opts.PodCIDR, opts.PodCIDR.Masked())
	}
	ns, err := e.newNetns(name)
	if err != nil {
		return nil, err
	}
	s := &Site{Netns: ns, SiteName: name, PodCIDR: opts.PodCIDR}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.all.forwarding", "1"},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
	} {
		if err := ns.sysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	var far *Netns
	var prefix netip.Prefix
	var gateway netip.Addr
	if opts.LAN != nil {
		far, s.Underlay = opts.LAN.ns, "lan0"
		if s.Addr, err = opts.LAN.nextAddr(); err != nil {
			return nil, err
		}
		prefix = opts.LAN.Prefix
		opts.LAN.mu.Lock()
		gateway = opts.LAN.gateway
		opts.LAN.mu.Unlock()
	} else {
		far, s.Underlay = opts.Router.ns, "wan0"
		seg := e.nextSegment()
		gateway = netip.AddrFrom4([4]byte{198, routedOctet2, byte(seg), 1})
		s.Addr = netip.AddrFrom4([4]byte{198, routedOctet2, byte(seg), 2})
		prefix = netip.PrefixFrom(gateway, 24).Masked()
	}
	farName := "s-" + name
	if err := ns.nl.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.Underlay},
		PeerName:      farName,
		PeerNamespace: netlink.NsFd(far.handle),
	}); err != nil {
		return nil, fmt.Errorf("create veth %s/%s: %w", s.Underlay, farName, err)
	}
	under, err := ns.nl.LinkByName(s.Underlay)
	if err != nil {
		return nil, err
	}
	if err := ns.nl.AddrAdd(under, addrOf(netip.PrefixFrom(s.Addr, prefix.Bits()))); err != nil {
		return nil, fmt.Errorf("address %s: %w", s.Addr, err)
	}
	if err := ns.nl.LinkSetUp(under); err != nil {
		return nil, err
	}
	peer, err := far.nl.LinkByName(farName)
	if err != nil {
		return nil, err
	}
	if opts.LAN != nil {
		br, err := far.nl.LinkByName("br0")
		if err != nil {
			return nil, err
		}
		if err := far.nl.LinkSetMaster(peer, br); err != nil {
			return nil, fmt.Errorf("attach %s to bridge: %w", farName, err)
		}
	} else if err := far.nl.AddrAdd(peer, addrOf(netip.PrefixFrom(gateway, 24))); err != nil {
		return nil, fmt.Errorf("router address %s: %w", gateway, err)
	}
	if err := far.nl.LinkSetUp(peer); err != nil {
		return nil, err
	}
	if gateway.IsValid() {
		if err := ns.nl.RouteAdd(&netlink.Route{Gw: net.IP(gateway.AsSlice()), LinkIndex: under.Attrs().Index}); err != nil {
			return nil, fmt.Errorf("default route via %s: %w", gateway, err)
		}
	}
	return s, nil
}

func addrOf(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
}

// Pod is a network namespace holding one address behind a site: eth0 with
// the address as a /32 (/128), default route via the site.
type Pod struct {
	*Netns
	PodName string
	Addr    netip.Addr
	Site    *Site
	// SiteLink is the name of the pod's veth on the site's side.
	SiteLink string
}

// AddPod creates a pod with address addr behind the site.
func (s *Site) AddPod(name string, addr netip.Addr) *Pod {
	s.env.t.Helper()
	p, err := s.addPod(name, addr)
	if err != nil {
		s.env.fatalf("pod %s in site %s: %v", name, s.SiteName, err)
	}
	return p
}

func (s *Site) addPod(name string, addr netip.Addr) (*Pod, error) {
	if err := checkName("pod", name); err != nil {
		return nil, err
	}
	if s.PodCIDR.IsValid() && !s.PodCIDR.Contains(addr) {
		return nil, fmt.Errorf("address %s is outside the site's PodCIDR %s", addr, s.PodCIDR)
	}
	ns, err := s.env.newNetns(s.SiteName + "-" + name)
	if err != nil {
		return nil, err
	}
	s.pods++
	p := &Pod{Netns: ns, PodName: name, Addr: addr, Site: s, SiteLink: fmt.Sprintf("pod%d", s.pods)}
	if err := ns.nl.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "eth0"},
		PeerName:      p.SiteLink,
		PeerNamespace: netlink.NsFd(s.handle),
	}); err != nil {
		return nil, fmt.Errorf("create veth: %w", err)
	}
	gw, bits := netip.MustParseAddr(podGateway4), 32
	if addr.Is6() {
		gw, bits = netip.MustParseAddr(podGateway6), 128
	}
	eth0, err := ns.nl.LinkByName("eth0")
	if err != nil {
		return nil, err
	}
	podAddr := addrOf(netip.PrefixFrom(addr, bits))
	podAddr.Flags = 0
	if addr.Is6() {
		podAddr.Flags = 0x02 // IFA_F_NODAD: usable at once
	}
	if err := ns.nl.AddrAdd(eth0, podAddr); err != nil {
		return nil, fmt.Errorf("address %s: %w", addr, err)
	}
	if err := ns.nl.LinkSetUp(eth0); err != nil {
		return nil, err
	}
	siteEnd, err := s.nl.LinkByName(p.SiteLink)
	if err != nil {
		return nil, err
	}
	if err := s.nl.AddrAdd(siteEnd, addrOf(netip.PrefixFrom(gw, bits))); err != nil {
		return nil, fmt.Errorf("gateway address on %s: %w", p.SiteLink, err)
	}
	if err := s.nl.LinkSetUp(siteEnd); err != nil {
		return nil, err
	}
	if err := s.nl.RouteAdd(&netlink.Route{
		Dst:       &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(bits, addr.BitLen())},
		LinkIndex: siteEnd.Attrs().Index,
		Scope:     netlink.SCOPE_LINK,
	}); err != nil {
		return nil, fmt.Errorf("route to pod %s: %w", addr, err)
	}
	if err := ns.nl.RouteAdd(&netlink.Route{
		Dst:       &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(bits, gw.BitLen())},
		LinkIndex: eth0.Attrs().Index,
		Scope:     netlink.SCOPE_LINK,
	}); err != nil {
		return nil, fmt.Errorf("route to gateway: %w", err)
	}
	if err := ns.nl.RouteAdd(&netlink.Route{Gw: gw.AsSlice(), LinkIndex: eth0.Attrs().Index}); err != nil {
		return nil, fmt.Errorf("default route: %w", err)
	}
	return p, nil
}

// Ping sends ICMP echo requests to addr from the namespace and returns nil
// on the first reply; it tries up to three times, one second each.
func (n *Netns) Ping(addr netip.Addr) error {
	var err error
	for range 3 {
		if _, err = n.Exec(context.Background(), "ping", "-n", "-c", "1", "-W", "1", addr.String()); err == nil {
			return nil
		}
	}
	return fmt.Errorf("ping %s from %s: %w", addr, n.Name, err)
}

// ServeTCP starts a server on port inside the namespace, on all addresses,
// until the test ends. To each connection it answers one line with the
// address it sees the client as and its own namespace's name, after
// reading one line from it: a caller knows who answered.
func (n *Netns) ServeTCP(port uint16) {
	n.env.t.Helper()
	l, err := n.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		n.env.fatalf("listen on %d in %s: %v", port, n.Name, err)
	}
	n.env.t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				from, _ := netip.ParseAddrPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s %s\n", from.Addr().Unmap(), n.Name)
			}()
		}
	}()
}

// TCPExchange connects to a ServeTCP server at to, sends a line and returns
// the address the server saw this end as.
func (n *Netns) TCPExchange(to netip.AddrPort) (netip.Addr, error) {
	a, err := n.TCPAnswer(to)
	return a.Seen, err
}

// TCPAnswer is TCPExchange that also says who answered.
func (n *Netns) TCPAnswer(to netip.AddrPort) (Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := n.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return Answer{}, fmt.Errorf("connect %s from %s: %w", to, n.Name, err)
	}
	defer c.Close()
	return Hello(c, n.Name)
}

// Answer is what a line-echo server (ServeTCP, the test server's TCP
// port) or the test server's HTTP "/" says: who answered and the address
// it saw the caller as.
type Answer struct {
	Seen netip.Addr
	Host string // the server's name: its namespace's (ServeTCP), its pod's (the test server)
	UID  string // its pod's UID; empty from ServeTCP, or a test server without POD_UID
}

// Hello has the line-echo server at the other end of c answer.
func Hello(c net.Conn, from string) (Answer, error) {
	to := c.RemoteAddr()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "hello from %s\n", from); err != nil {
		return Answer{}, fmt.Errorf("send to %s: %w", to, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return Answer{}, fmt.Errorf("read from %s: %w", to, err)
	}
	a, err := ParseHello(line)
	if err != nil {
		return Answer{}, fmt.Errorf("answer of %s: %w", to, err)
	}
	return a, nil
}

// ParseHello reads a line-echo server's answer: the address it saw the
// caller as, its name and, from the test server, its pod's UID.
func ParseHello(line string) (Answer, error) {
	f := strings.Fields(line)
	if len(f) == 2 || len(f) == 3 {
		if seen, err := netip.ParseAddr(f[0]); err == nil {
			return Answer{Seen: seen, Host: f[1], UID: strings.Join(f[2:], "")}, nil
		}
	}
	return Answer{}, fmt.Errorf("%q is not an address, a name and maybe a UID", line)
}

// Delete removes the pod's veth and namespace before the test ends. The
// veth goes first, by its site end, at once: the kernel tears a deleted
// namespace down later, on a work queue, and until then its devices
// still answer. The site's route to the pod goes with the veth.
func (p *Pod) Delete() {
	if l, err := p.Site.nl.LinkByName(p.SiteLink); err == nil {
		if err := p.Site.nl.LinkDel(l); err != nil {
			p.env.t.Logf("harness: delete veth %s of pod %s: %v", p.SiteLink, p.Name, err)
		}
	}
	p.close()
	if err := deleteNetns(p.Name); err != nil {
		p.env.t.Logf("harness: %v", err)
	}
}
