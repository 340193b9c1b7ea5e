package tunnel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeTable reconciles the routes of my views into the tunnel. Ours are
// the routes through our own WireGuard link that carry our protocol number
// in our table: the protocol number alone is host-wide and anyone may use
// it, the link is ours alone. No other route is ever changed or removed,
// whatever its protocol. It keeps a record of the routes it made, so a
// change of some peers adds and deletes only their routes without listing
// the table; route deletion events and the periodic resync list it.
type routeTable struct {
	table    int
	protocol int

	applied map[netip.Prefix]bool // nil when unknown
	link    int                   // the link index applied routes go through
	src     netip.Addr            // the preferred source of applied routes
}

// ours lists our routes through the link with index linkIndex.
func (rt *routeTable) ours(linkIndex int) ([]netlink.Route, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{LinkIndex: linkIndex, Table: rt.table, Protocol: netlink.RouteProtocol(rt.protocol)},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("list routes of table %d through link %d: %w", rt.table, linkIndex, err)
	}
	return routes, nil
}

// isOurs reports whether a route the kernel reported is one of ours
// through the link with index linkIndex.
func (rt *routeTable) isOurs(r netlink.Route, linkIndex int) bool {
	return r.LinkIndex == linkIndex && r.Table == rt.table && int(r.Protocol) == rt.protocol
}

func (rt *routeTable) invalidate() { rt.applied = nil }

// reconcile makes exactly the routes for want exist through the link, with
// src as their preferred source (none if zero), and reports how many it
// added, changed or removed. With full set, or without a record for this
// link and source, it lists the table first.
func (rt *routeTable) reconcile(linkIndex int, want []netip.Prefix, src netip.Addr, full bool) (int, error) {
	if !full && rt.applied != nil && rt.link == linkIndex && rt.src == src {
		if n, err := rt.update(linkIndex, want); err == nil {
			return n, nil
		}
		// The record was wrong (a route of ours deleted or added behind
		// our back): list the table and try again.
	}
	return rt.resync(linkIndex, want, src)
}

// update adds and deletes the difference between the record and want.
func (rt *routeTable) update(linkIndex int, want []netip.Prefix) (int, error) {
	wanted := make(map[netip.Prefix]bool, len(want))
	for _, p := range want {
		wanted[p] = true
	}
	changes := 0
	for p := range rt.applied {
		if wanted[p] {
			continue
		}
		r := rt.route(linkIndex, p)
		if err := netlink.RouteDel(&r); err != nil {
			rt.applied = nil
			return changes, fmt.Errorf("delete route %s: %w", p, err)
		}
		delete(rt.applied, p)
		changes++
	}
	for _, p := range want {
		if rt.applied[p] {
			continue
		}
		r := rt.route(linkIndex, p)
		if err := netlink.RouteAdd(&r); err != nil {
			rt.applied = nil
			return changes, fmt.Errorf("add route %s: %w", p, err)
		}
		rt.applied[p] = true
		changes++
	}
	return changes, nil
}

// resync lists our routes and makes them exactly want, with source src.
func (rt *routeTable) resync(linkIndex int, want []netip.Prefix, src netip.Addr) (int, error) {
	rt.applied = nil
	rt.src = src
	have, err := rt.ours(linkIndex)
	if err != nil {
		return 0, err
	}
	wanted := make(map[netip.Prefix]bool, len(want))
	for _, p := range want {
		wanted[p] = true
	}
	changes := 0
	var errs []error
	for _, r := range have {
		p := prefixOf(r.Dst)
		if wanted[p] {
			delete(wanted, p)
			if !sameSource(r.Src, src) {
				fixed := rt.route(linkIndex, p)
				if err := netlink.RouteReplace(&fixed); err != nil {
					errs = append(errs, fmt.Errorf("set source of route %s to %s: %w", p, src, err))
					continue
				}
				changes++
			}
			continue
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", p, err))
			continue
		}
		changes++
	}
	for _, p := range want {
		if !wanted[p] {
			continue
		}
		r := rt.route(linkIndex, p)
		if err := netlink.RouteAdd(&r); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("a route to %s not made by us (another link, or another protocol than %d) exists in table %d; remove it or change the view", p, rt.protocol, rt.table)
			}
			errs = append(errs, fmt.Errorf("add route %s: %w", p, err))
			continue
		}
		changes++
	}
	if err := errors.Join(errs...); err != nil {
		return changes, err
	}
	rt.applied = make(map[netip.Prefix]bool, len(want))
	for _, p := range want {
		rt.applied[p] = true
	}
	rt.link = linkIndex
	return changes, nil
}

func (rt *routeTable) route(linkIndex int, p netip.Prefix) netlink.Route {
	r := netlink.Route{
		LinkIndex: linkIndex,
		Dst:       &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Table:     rt.table,
		Protocol:  netlink.RouteProtocol(rt.protocol),
		Scope:     netlink.SCOPE_LINK,
	}
	if rt.src.IsValid() {
		r.Src = rt.src.AsSlice()
	}
	return r
}

// sameSource reports whether a route's preferred source is src (nil for
// none).
func sameSource(ip net.IP, src netip.Addr) bool {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return !src.IsValid()
	}
	return a.Unmap() == src
}

// removeAll deletes every route of ours through the link with index
// linkIndex.
func (rt *routeTable) removeAll(linkIndex int) error {
	have, err := rt.ours(linkIndex)
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

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}
