package fabric

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// plan is a Desired turned into kernel objects for this node.
type plan struct {
	routes  map[netip.Prefix]route
	iif     string // our rule's input interface; empty: every lookup
	views   []netip.Prefix
	links   []int        // links our direct routes go through, and the overlay's underlays
	overlay *overlayPlan // nil: every node shares a link with this one
	// hostSource is the views' preferred source on a worker; zero: none.
	hostSource netip.Addr
}

// route is one route of ours: dst via a neighbour on a link, or through
// the overlay via a peer's next hop there.
type route struct {
	via     netip.Addr
	link    int // for overlay routes, filled in once the link exists
	mtu     int
	overlay bool
	src     netip.Addr // preferred source; zero: none
}

// plan finds the links that reach the gateway (workers) or the nodes
// (gateway): directly where they share a link, through the overlay where
// a router is in between. It changes nothing.
func (f *Fabric) plan(d Desired) (plan, error) {
	p := plan{routes: map[netip.Prefix]route{}, views: d.Views}
	r := f.cfg.OverlayRange
	switch d.Role {
	case Worker:
		p.hostSource = d.HostSource
		at, err := reach(d.Gateway)
		if err != nil {
			return p, fmt.Errorf("route views via gateway %s: %w", d.Gateway, err)
		}
		if at.local {
			return p, fmt.Errorf("gateway address %s is this node's own: run this node with role %q", d.Gateway, Gateway)
		}
		p.links = []int{at.link}
		if !at.router.IsValid() {
			for _, v := range d.Views {
				p.routes[v] = route{via: d.Gateway, link: at.link, mtu: d.MTU, src: d.HostSource}
			}
			break
		}
		o := &overlayPlan{}
		if err := o.addPeer(r, d.Gateway, at.link); err != nil {
			return p, err
		}
		if err := f.checkOverlay(o, d.Addr, d); err != nil {
			return p, fmt.Errorf("gateway %s is reached via router %s, so through the overlay: %w", d.Gateway, at.router, err)
		}
		mtu := o.mtu
		if d.MTU != 0 {
			mtu = min(d.MTU, o.mtu)
		}
		for _, v := range d.Views {
			p.routes[v] = route{via: o.peers[0].inner, mtu: mtu, overlay: true, src: d.HostSource}
		}
		p.overlay = o
	case Gateway:
		p.iif = d.TunnelInterface
		o := &overlayPlan{}
		for _, n := range d.Nodes {
			at, err := reach(n.Addr)
			if err != nil {
				return p, fmt.Errorf("route pod blocks %v to node %s: %w", n.PodCIDRs, n.Addr, err)
			}
			if at.local {
				continue // this node's own blocks are its CNI's
			}
			if !slices.Contains(p.links, at.link) {
				p.links = append(p.links, at.link)
			}
			if !at.router.IsValid() {
				for _, b := range n.PodCIDRs {
					p.routes[b] = route{via: n.Addr, link: at.link}
				}
				continue
			}
			if err := o.addPeer(r, n.Addr, at.link); err != nil {
				return p, err
			}
			for _, b := range n.PodCIDRs {
				p.routes[b] = route{via: innerAddr(r, n.Addr), overlay: true}
			}
		}
		if len(o.peers) > 0 {
			if err := f.checkOverlay(o, d.Addr, d); err != nil {
				return p, fmt.Errorf("nodes reached via a router go through the overlay: %w", err)
			}
			p.overlay = o
		}
	}
	return p, nil
}

// path is how this node reaches an address.
type path struct {
	local  bool       // the address is this node's own
	link   int        // the link it leaves by
	router netip.Addr // the router it goes through; invalid if none
}

// reach asks the kernel how this node reaches a.
func reach(a netip.Addr) (path, error) {
	rs, err := netlink.RouteGet(a.AsSlice())
	if errors.Is(err, unix.ENETUNREACH) || (err == nil && len(rs) == 0) {
		return path{}, fmt.Errorf("%s is not on a network this node is connected to, nor behind a router it knows (no route to it)", a)
	}
	if err != nil {
		return path{}, fmt.Errorf("look up the route to %s: %w", a, err)
	}
	r := rs[0]
	if r.Type == unix.RTN_LOCAL {
		return path{local: true}, nil
	}
	at := path{link: r.LinkIndex}
	if r.Gw != nil {
		at.router, _ = netip.AddrFromSlice(r.Gw)
		at.router = at.router.Unmap()
	}
	return at, nil
}

// ours lists the routes in our table with our protocol.
func ours(cfg Config) ([]netlink.Route, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Table: cfg.Table, Protocol: netlink.RouteProtocol(cfg.RouteProtocol)},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("list routes of table %d: %w", cfg.Table, err)
	}
	return rs, nil
}

func (f *Fabric) netlinkRoute(dst netip.Prefix, r route) netlink.Route {
	return netlink.Route{
		LinkIndex: r.link,
		Dst:       ipNet(dst),
		Gw:        r.via.AsSlice(),
		Table:     f.cfg.Table,
		Protocol:  netlink.RouteProtocol(f.cfg.RouteProtocol),
		MTU:       r.mtu,
		Flags:     onlink(r.overlay),
		Src:       srcOf(r.src),
	}
}

func srcOf(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return a.AsSlice()
}

// onlink: overlay routes name a next hop no address of the link covers.
func onlink(overlay bool) int {
	if overlay {
		return int(netlink.FLAG_ONLINK)
	}
	return 0
}

// reconcileRoutes lists our routes and adds, replaces or deletes only
// those that differ from p. A route of ours is replaced in place, so its
// destination is never without one.
func (f *Fabric) reconcileRoutes(p plan, ch *changes) error {
	have, err := ours(f.cfg)
	if err != nil {
		return err
	}
	var errs []error
	found := map[netip.Prefix]bool{}
	for _, k := range have {
		dst := prefixOf(k.Dst)
		want, ok := p.routes[dst]
		switch {
		case !ok || found[dst]:
			if err := netlink.RouteDel(&k); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route %s: %w", dst, err))
				continue
			}
			ch.routesDeleted++
		case !same(k, want):
			r := f.netlinkRoute(dst, want)
			if err := netlink.RouteReplace(&r); err != nil {
				errs = append(errs, fmt.Errorf("replace route %s via %s: %w", dst, want.via, err))
				continue
			}
			ch.routesChanged++
		}
		found[dst] = true
	}
	for dst, want := range p.routes {
		if found[dst] {
			continue
		}
		r := f.netlinkRoute(dst, want)
		if err := netlink.RouteAdd(&r); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("a route to %s not made by us (another protocol than %d) exists in table %d; remove it or configure another table", dst, f.cfg.RouteProtocol, f.cfg.Table)
			}
			errs = append(errs, fmt.Errorf("add route %s via %s: %w", dst, want.via, err))
			continue
		}
		ch.routesAdded++
	}
	f.metrics.routes.Set(float64(len(have) - ch.routesDeleted + ch.routesAdded))
	return errors.Join(errs...)
}

// same reports whether a route of ours in the kernel is want.
func same(k netlink.Route, want route) bool {
	via, _ := netip.AddrFromSlice(k.Gw)
	src, _ := netip.AddrFromSlice(k.Src)
	return k.LinkIndex == want.link && via.Unmap() == want.via && k.MTU == want.mtu && len(k.MultiPath) == 0 &&
		src.Unmap() == want.src &&
		k.Flags&int(netlink.FLAG_ONLINK) == onlink(want.overlay)
}

func removeRoutes(cfg Config) error {
	have, err := ours(cfg)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range have {
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}

// ourRules lists the rules pointing at our table with our protocol.
func ourRules(cfg Config) ([]netlink.Rule, error) {
	rs, err := netlink.RuleListFiltered(netlink.FAMILY_V4, &netlink.Rule{Table: cfg.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	var out []netlink.Rule
	for _, r := range rs {
		if r.Table == cfg.Table && int(r.Protocol) == cfg.RouteProtocol {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *Fabric) rule(iif string) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = netlink.FAMILY_V4
	r.Priority = f.cfg.RulePriority
	r.Table = f.cfg.Table
	r.IifName = iif
	r.Protocol = uint8(f.cfg.RouteProtocol)
	return r
}

// isWanted reports whether a rule of ours is exactly the one we make:
// our priority, the input interface, and no other selector.
func (f *Fabric) isWanted(r netlink.Rule, iif string) bool {
	return r.Priority == f.cfg.RulePriority && r.IifName == iif && r.OifName == "" &&
		r.Src == nil && r.Dst == nil && r.Mark == 0 && r.Mask == nil && r.Tos == 0 &&
		r.IPProto == 0 && r.Dport == nil && r.Sport == nil && r.UIDRange == nil && !r.Invert &&
		r.Goto < 0 && r.SuppressPrefixlen < 0 && r.SuppressIfgroup < 0 && r.Type == 0
}

// reconcileRules keeps exactly one rule of ours, the one p wants.
func (f *Fabric) reconcileRules(p plan, ch *changes) error {
	have, err := ourRules(f.cfg)
	if err != nil {
		return err
	}
	found := false
	var errs []error
	for _, r := range have {
		if !found && f.isWanted(r, p.iif) {
			found = true
			continue
		}
		if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete rule %s: %w", r, err))
			continue
		}
		ch.rules++
	}
	if !found {
		if err := netlink.RuleAdd(f.rule(p.iif)); err != nil {
			errs = append(errs, fmt.Errorf("add rule priority %d lookup %d: %w", f.cfg.RulePriority, f.cfg.Table, err))
		} else {
			ch.rules++
		}
	}
	return errors.Join(errs...)
}

func removeRules(cfg Config) error {
	have, err := ourRules(cfg)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range have {
		if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete rule %s: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}
