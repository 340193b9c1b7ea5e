package agent

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/flotilla-io/flotilla/tunnel"
)

// defaultAddress picks the address other clusters reach this gateway at
// when --advertise-addr is not given: the source address of the default
// route, else the only global unicast IPv4 address of the host.
func defaultAddress() (netip.Addr, error) {
	if u, err := tunnel.DefaultRoute(); err == nil && u.Src.IsValid() {
		return u.Src, nil
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
