package fabric

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// A worker's own traffic to a view (the host's, a hostNetwork pod's)
// would leave with the node's address, which the peer cannot translate:
// only the pod networks are announced. So the worker keeps the first
// address of its own pod block (where bridge, flannel and Cilium put the
// host side) as a /32 on the loopback link, labelled as ours, and gives
// every view route it as the preferred source; the gateway's tunnel
// translates it like any pod address, and the gateway's route to the
// node's block brings the answer back. The gateway does the same on its
// WireGuard link (tunnel's HostSource). An address on lo, as MetalLB and
// kube-vip keep theirs, rather than a dummy link: not every kernel has the
// dummy driver (these test machines do not), every one has lo, and the
// label tells ours from anyone else's.

// reconcileHostSource makes the loopback link hold exactly src as a /32
// under our label, or no address under it when src is zero. It returns
// the loopback's index.
func (f *Fabric) reconcileHostSource(src netip.Addr, ch *changes) (int, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return 0, fmt.Errorf("look up lo: %w", err)
	}
	addrs, err := netlink.AddrList(lo, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("addresses of lo: %w", err)
	}
	want := netip.PrefixFrom(src, 32)
	found := false
	for _, a := range addrs {
		if a.Label != f.cfg.HostLabel {
			continue
		}
		if src.IsValid() && prefixOf(a.IPNet) == want {
			found = true
			continue
		}
		if err := netlink.AddrDel(lo, &a); err != nil {
			return 0, fmt.Errorf("delete %s (%s) from lo: %w", a.IPNet, a.Label, err)
		}
		ch.links++
	}
	if !src.IsValid() {
		return 0, nil
	}
	if !found {
		err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(want), Label: f.cfg.HostLabel})
		if err != nil {
			return 0, fmt.Errorf("add %s to lo as %s: %w", want, f.cfg.HostLabel, err)
		}
		ch.links++
	}
	return lo.Attrs().Index, nil
}

// removeHostSource deletes the addresses on lo under our label, and no
// other.
func removeHostSource(cfg Config) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("look up lo: %w", err)
	}
	addrs, err := netlink.AddrList(lo, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of lo: %w", err)
	}
	var errs []error
	for _, a := range addrs {
		if a.Label == cfg.HostLabel {
			if err := netlink.AddrDel(lo, &a); err != nil {
				errs = append(errs, fmt.Errorf("delete %s (%s) from lo: %w", a.IPNet, a.Label, err))
			}
		}
	}
	return errors.Join(errs...)
}
