package tunnel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// setHostSource makes src (a /32) the only IPv4 address on our link, or
// leaves it none when src is zero, and reports how many addresses it added
// or removed. The link is ours, so every address on it is. The address
// must be local for routes to name it as their source; the host may hold
// it on another link too (the CNI's bridge), which the kernel allows.
func setHostSource(linkIndex int, src netip.Addr) (int, error) {
	link, err := netlink.LinkByIndex(linkIndex)
	if err != nil {
		return 0, fmt.Errorf("look up link %d: %w", linkIndex, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
	}
	changes, found := 0, false
	var errs []error
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == src && ones == 32 {
			found = true
			continue
		}
		if err := netlink.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("remove address %s from %s: %w", a.IPNet, link.Attrs().Name, err))
			continue
		}
		changes++
	}
	if src.IsValid() && !found {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: src.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(link, a); err != nil {
			errs = append(errs, fmt.Errorf("add host source %s to %s: %w", src, link.Attrs().Name, err))
		} else {
			changes++
		}
	}
	return changes, errors.Join(errs...)
}
