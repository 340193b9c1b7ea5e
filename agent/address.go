package agent

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// defaultAddress picks the address other clusters reach this gateway at
// when --advertise-addr is not given: the source address of the default
// route, else the only global unicast IPv4 address of the host.
func defaultAddress() (netip.Addr, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err == nil {
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
				if a, ok := netip.AddrFromSlice(r.Src); ok && a.IsValid() {
					return a.Unmap(), nil
				}
				if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
					if a, ok := firstAddr(link); ok {
						return a, nil
					}
				}
			}
		}
	}
	var found []netip.Addr
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap().Is4() && ip.IsGlobalUnicast() {
				found = append(found, ip.Unmap())
			}
		}
	}
	if len(found) == 1 {
		return found[0], nil
	}
	return netip.Addr{}, fmt.Errorf("cannot choose the address other clusters reach this gateway at (%d candidates, no default route): pass --advertise-addr", len(found))
}

func firstAddr(link netlink.Link) (netip.Addr, bool) {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
			return ip.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
