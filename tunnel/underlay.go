package tunnel

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Underlay is the way out of this host to other clusters: the IPv4
// default route of the main table. It gives the tunnel's MTU and the
// address other clusters reach this gateway at.
type Underlay struct {
	Link      string
	LinkIndex int
	MTU       int
	// Gateway is the next hop; invalid for a default route on the link.
	Gateway netip.Addr
	// Src is the route's preferred source address, else the first global
	// unicast IPv4 address of the link; invalid if there is neither.
	Src netip.Addr
}

// errNoDefaultRoute is what DefaultRoute wraps when there is none.
var errNoDefaultRoute = errors.New("no IPv4 default route in the main table")

// DefaultRoute looks up the underlay: of the IPv4 default routes of the
// main table, the one the kernel prefers (lowest metric). The one lookup
// of the default route there is.
func DefaultRoute() (Underlay, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Table: unix.RT_TABLE_MAIN, Type: unix.RTN_UNICAST},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
	if err != nil {
		return Underlay{}, fmt.Errorf("list routes: %w", err)
	}
	var best *netlink.Route
	for i, r := range routes {
		if r.Dst != nil && prefixOf(r.Dst).Bits() != 0 {
			continue
		}
		if best == nil || r.Priority < best.Priority {
			best = &routes[i]
		}
	}
	if best == nil {
		return Underlay{}, errNoDefaultRoute
	}
	index, gw := best.LinkIndex, best.Gw
	if index == 0 && len(best.MultiPath) > 0 { // multipath: the first next hop
		index, gw = best.MultiPath[0].LinkIndex, best.MultiPath[0].Gw
	}
	link, err := netlink.LinkByIndex(index)
	if err != nil {
		return Underlay{}, fmt.Errorf("look up the default route's link %d: %w", index, err)
	}
	u := Underlay{Link: link.Attrs().Name, LinkIndex: index, MTU: link.Attrs().MTU}
	if a, ok := netip.AddrFromSlice(gw); ok {
		u.Gateway = a.Unmap()
	}
	if a, ok := netip.AddrFromSlice(best.Src); ok && a.IsValid() {
		u.Src = a.Unmap()
	} else {
		u.Src = firstGlobalAddr(link)
	}
	return u, nil
}

// firstGlobalAddr is the link's first global unicast IPv4 address, if any.
func firstGlobalAddr(link netlink.Link) netip.Addr {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}
