package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The overlay carries view traffic between a worker and the gateway when
// they do not share a link: one VXLAN link of ours per node, unicast FDB
// entries only (no multicast group, no learning), and a permanent
// neighbour entry per remote node, so nothing is ever flooded or learnt.
const (
	// overlayAlias tags our VXLAN link (`ip link` shows it as "alias");
	// a link of our name without it is someone else's and never touched.
	overlayAlias = "flotilla fabric overlay"
	// vxlanOverhead is what VXLAN adds over IPv4: outer IP 20, UDP 8,
	// VXLAN 8, inner Ethernet 14.
	vxlanOverhead = 50
)

// overlayPlan is the overlay one node needs; nil when every node it
// talks to shares a link with it.
type overlayPlan struct {
	mac   net.HardwareAddr // this node's VXLAN link's address
	mtu   int              // the VXLAN link's MTU: the smallest underlay's minus the overhead
	peers []overlayPeer
}

// overlayPeer is a node at the other end of the overlay.
type overlayPeer struct {
	addr  netip.Addr // on the node network: the FDB entry's destination
	inner netip.Addr // the next hop our routes name; never on any link
	mac   net.HardwareAddr
}

// innerAddr is the next hop that stands for a node on the overlay: the
// node's address with its high bits replaced by the overlay range's, as
// Submariner does with 240.0.0.0/8. It is a name for a neighbour entry
// only, never an address of any link.
func innerAddr(r netip.Prefix, node netip.Addr) netip.Addr {
	base, a := r.Addr().As4(), node.As4()
	host := ^uint32(0) >> r.Bits()
	v := binary.BigEndian.Uint32(base[:])&^host | binary.BigEndian.Uint32(a[:])&host
	return netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, v)))
}

// overlayMAC is the VXLAN link address of the node at a: locally
// administered, 0x66 (102, our number) and the node's address, so both
// ends derive it and no ARP is needed.
func overlayMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x0a, 0x66, b[0], b[1], b[2], b[3]}
}

// addPeer adds a node reached through a router to the overlay, with the
// MTU of the underlay link that reaches it.
func (o *overlayPlan) addPeer(r netip.Prefix, a netip.Addr, underlay int) error {
	l, err := netlink.LinkByIndex(underlay)
	if err != nil {
		return fmt.Errorf("underlay link %d toward %s: %w", underlay, a, err)
	}
	if mtu := l.Attrs().MTU - vxlanOverhead; o.mtu == 0 || mtu < o.mtu {
		o.mtu = mtu
	}
	o.peers = append(o.peers, overlayPeer{addr: a, inner: innerAddr(r, a), mac: overlayMAC(a)})
	return nil
}

// checkOverlay refuses an overlay whose next hops collide, with each other
// or with a view or pod block, and a self address that is not this
// node's own.
func (f *Fabric) checkOverlay(o *overlayPlan, self netip.Addr, d Desired) error {
	r := f.cfg.OverlayRange
	if !self.IsValid() {
		return fmt.Errorf("the overlay needs this node's own address (Desired.Addr: its Node's InternalIP) to derive its overlay address from; the plan gave none")
	}
	if at, err := reach(self); err != nil || !at.local {
		return fmt.Errorf("address %s given as this node's own is not an address of this node: the overlay derives this node's VXLAN address from it; check the Node's InternalIP", self)
	}
	for _, v := range d.Views {
		if v.Overlaps(r) {
			return fmt.Errorf("view %s overlaps the overlay range %s: configure another overlay range (Config.OverlayRange)", v, r)
		}
	}
	for _, n := range d.Nodes {
		for _, b := range n.PodCIDRs {
			if b.Overlaps(r) {
				return fmt.Errorf("pod block %s of node %s overlaps the overlay range %s: configure another overlay range (Config.OverlayRange)", b, n.Addr, r)
			}
		}
	}
	seen := map[netip.Addr]netip.Addr{innerAddr(r, self): self}
	for _, p := range o.peers {
		if other, ok := seen[p.inner]; ok && other != p.addr {
			return fmt.Errorf("nodes %s and %s share the overlay address %s in %s: configure a larger overlay range (Config.OverlayRange, up to 240.0.0.0/4)", other, p.addr, p.inner, r)
		}
		seen[p.inner] = p.addr
	}
	o.mac = overlayMAC(self)
	return nil
}

// isOurs reports whether a link of our name is our VXLAN link: a VXLAN
// link with our alias, or with no alias and our VNI and port (the kernel
// takes no alias when it creates a link, so we set it just after; a crash
// in between leaves such a link). Any other is someone else's.
func isOurs(cfg Config, l netlink.Link) bool {
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return false
	}
	return v.Alias == overlayAlias || (v.Alias == "" && v.VxlanId == cfg.VNI && v.Port == cfg.VXLANPort)
}

func foreignLink(name string, l netlink.Link) error {
	return fmt.Errorf("a link named %s exists that the fabric did not make (type %s, alias %q); the fabric never adopts it: remove it, or configure another overlay link name (Config.OverlayLink)", name, l.Type(), l.Attrs().Alias)
}

// reconcileOverlay makes our VXLAN link, its FDB and its neighbours those
// of o, or deletes the link when o is nil; it returns the link's index.
func (f *Fabric) reconcileOverlay(o *overlayPlan, ch *changes) (int, error) {
	name := f.cfg.OverlayLink
	l, err := netlink.LinkByName(name)
	if err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return 0, fmt.Errorf("look up link %s: %w", name, err)
	}
	if l != nil && !isOurs(f.cfg, l) {
		if o == nil {
			return 0, nil // not ours, not needed: none of our business
		}
		return 0, foreignLink(name, l)
	}
	if o == nil {
		if l != nil {
			if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
				return 0, fmt.Errorf("delete overlay link %s: %w", name, err)
			}
			ch.overlay++
		}
		return 0, nil
	}
	if l != nil && !f.sameVXLAN(l) {
		// Ours, but made with other settings: made again.
		if err := netlink.LinkDel(l); err != nil {
			return 0, fmt.Errorf("delete overlay link %s to make it again: %w", name, err)
		}
		ch.overlay++
		l = nil
	}
	if l == nil {
		if l, err = f.addVXLAN(o); err != nil {
			return 0, err
		}
		ch.overlay++
	}
	idx := l.Attrs().Index
	var errs []error
	if l.Attrs().Alias != overlayAlias {
		if err := netlink.LinkSetAlias(l, overlayAlias); err != nil {
			errs = append(errs, fmt.Errorf("tag %s with alias %q: %w", name, overlayAlias, err))
		} else {
			ch.overlay++
		}
	}
	if a := l.Attrs(); a.MTU != o.mtu {
		if err := netlink.LinkSetMTU(l, o.mtu); err != nil {
			errs = append(errs, fmt.Errorf("set mtu %d on %s: %w", o.mtu, name, err))
		} else {
			ch.overlay++
		}
	}
	if !slices.Equal(l.Attrs().HardwareAddr, o.mac) {
		if err := netlink.LinkSetHardwareAddr(l, o.mac); err != nil {
			errs = append(errs, fmt.Errorf("set address %s on %s: %w", o.mac, name, err))
		} else {
			ch.overlay++
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			errs = append(errs, fmt.Errorf("set %s up: %w", name, err))
		} else {
			ch.overlay++
		}
	}
	if err := reconcileFDB(idx, o.peers, ch); err != nil {
		errs = append(errs, err)
	}
	if err := reconcileNeighbours(idx, o.peers, ch); err != nil {
		errs = append(errs, err)
	}
	return idx, errors.Join(errs...)
}

// sameVXLAN reports whether our link has the settings we make it with.
func (f *Fabric) sameVXLAN(l netlink.Link) bool {
	v, ok := l.(*netlink.Vxlan)
	return ok && v.VxlanId == f.cfg.VNI && v.Port == f.cfg.VXLANPort && !v.Learning && v.Group == nil && v.VtepDevIndex == 0
}

func (f *Fabric) addVXLAN(o *overlayPlan) (netlink.Link, error) {
	name := f.cfg.OverlayLink
	v := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: name, MTU: o.mtu, HardwareAddr: o.mac},
		VxlanId:   f.cfg.VNI,
		Port:      f.cfg.VXLANPort,
		Learning:  false,
	}
	if err := netlink.LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("add VXLAN link %s (VNI %d, UDP port %d): a link with this VNI and port, or this name, exists already: configure another (Config.VNI, Config.VXLANPort, Config.OverlayLink): %w", name, f.cfg.VNI, f.cfg.VXLANPort, err)
		}
		return nil, fmt.Errorf("add VXLAN link %s (VNI %d, UDP port %d): %w", name, f.cfg.VNI, f.cfg.VXLANPort, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("read back VXLAN link %s: %w", name, err)
	}
	return l, nil
}

func fdbEntry(idx int, p overlayPeer) netlink.Neigh {
	return netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, HardwareAddr: p.mac, IP: p.addr.AsSlice()}
}

// reconcileFDB keeps exactly one unicast FDB entry per peer on our link:
// its MAC to its node address. The link is ours, so every entry is.
func reconcileFDB(idx int, peers []overlayPeer, ch *changes) error {
	have, err := netlink.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("list FDB of the overlay link: %w", err)
	}
	want := map[string]overlayPeer{}
	for _, p := range peers {
		want[p.mac.String()] = p
	}
	var errs []error
	found := map[string]bool{}
	for _, n := range have {
		if n.LinkIndex != idx {
			continue
		}
		p, ok := want[n.HardwareAddr.String()]
		ip, _ := netip.AddrFromSlice(n.IP)
		if ok && !found[p.mac.String()] && ip.Unmap() == p.addr && n.State&netlink.NUD_PERMANENT != 0 {
			found[p.mac.String()] = true
			continue
		}
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete FDB entry %s dst %s: %w", n.HardwareAddr, n.IP, err))
			continue
		}
		ch.overlay++
	}
	for _, p := range peers {
		if found[p.mac.String()] {
			continue
		}
		e := fdbEntry(idx, p)
		if err := netlink.NeighAppend(&e); err != nil {
			errs = append(errs, fmt.Errorf("add FDB entry %s dst %s: %w", p.mac, p.addr, err))
			continue
		}
		ch.overlay++
	}
	return errors.Join(errs...)
}

// reconcileNeighbours keeps one permanent neighbour entry per peer on our
// link, its next hop to its MAC, so no ARP crosses the overlay.
func reconcileNeighbours(idx int, peers []overlayPeer, ch *changes) error {
	have, err := netlink.NeighList(idx, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("list neighbours of the overlay link: %w", err)
	}
	want := map[netip.Addr]overlayPeer{}
	for _, p := range peers {
		want[p.inner] = p
	}
	var errs []error
	found := map[netip.Addr]bool{}
	for _, n := range have {
		if n.LinkIndex != idx {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		ip = ip.Unmap()
		if p, ok := want[ip]; ok && slices.Equal(n.HardwareAddr, p.mac) && n.State&netlink.NUD_PERMANENT != 0 {
			found[ip] = true
			continue
		}
		if _, ok := want[ip]; ok {
			continue // replaced below
		}
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete neighbour %s: %w", ip, err))
			continue
		}
		ch.overlay++
	}
	for _, p := range peers {
		if found[p.inner] {
			continue
		}
		n := netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: p.inner.AsSlice(), HardwareAddr: p.mac}
		if err := netlink.NeighSet(&n); err != nil {
			errs = append(errs, fmt.Errorf("set neighbour %s lladdr %s: %w", p.inner, p.mac, err))
			continue
		}
		ch.overlay++
	}
	return errors.Join(errs...)
}

// removeOverlay deletes our VXLAN link, with its FDB, neighbours and
// routes; a link of that name that is not ours stays.
func removeOverlay(cfg Config) error {
	l, err := netlink.LinkByName(cfg.OverlayLink)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up link %s: %w", cfg.OverlayLink, err)
	}
	if !isOurs(cfg, l) {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return fmt.Errorf("delete overlay link %s: %w", cfg.OverlayLink, err)
	}
	return nil
}
