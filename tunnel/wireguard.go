package tunnel

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// configureDevice sets the private key and listen port if they differ.
func (t *Tunnel) configureDevice() error {
	dev, err := t.wg.Device(t.cfg.Interface)
	if err != nil {
		return fmt.Errorf("read wireguard device %s: %w", t.cfg.Interface, err)
	}
	var cfg wgtypes.Config
	if Key(dev.PrivateKey) != t.key {
		k := wgtypes.Key(t.key)
		cfg.PrivateKey = &k
	}
	if dev.ListenPort != t.cfg.ListenPort {
		cfg.ListenPort = &t.cfg.ListenPort
	}
	if cfg.PrivateKey == nil && cfg.ListenPort == nil {
		return nil
	}
	if err := t.wg.ConfigureDevice(t.cfg.Interface, cfg); err != nil {
		return fmt.Errorf("configure wireguard device %s: %w", t.cfg.Interface, err)
	}
	return nil
}

// configurePeers makes the device hold exactly the desired peers, sending
// only the peers that differ. Every peer on our device is ours.
func (t *Tunnel) configurePeers(d Desired) (int, error) {
	dev, err := t.wg.Device(t.cfg.Interface)
	if err != nil {
		return 0, fmt.Errorf("read wireguard device %s: %w", t.cfg.Interface, err)
	}
	var cfg wgtypes.Config
	changes := 0
	if Key(dev.PrivateKey) != t.key {
		k := wgtypes.Key(t.key)
		cfg.PrivateKey = &k
		changes++
	}
	if dev.ListenPort != t.cfg.ListenPort {
		cfg.ListenPort = &t.cfg.ListenPort
		changes++
	}
	have := make(map[Key]wgtypes.Peer, len(dev.Peers))
	for _, p := range dev.Peers {
		have[Key(p.PublicKey)] = p
	}
	ids := make(map[Key]string, len(d.Peers))
	for _, p := range d.Peers {
		ids[p.PublicKey] = p.ClusterID
		cur, ok := have[p.PublicKey]
		delete(have, p.PublicKey)
		if ok && peerMatches(cur, p) {
			continue
		}
		cfg.Peers = append(cfg.Peers, peerConfig(p))
		changes++
	}
	for k := range have {
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: wgtypes.Key(k), Remove: true})
		changes++
	}
	t.peerIDs = ids
	if changes == 0 {
		return 0, nil
	}
	if err := t.wg.ConfigureDevice(t.cfg.Interface, cfg); err != nil {
		return 0, fmt.Errorf("configure wireguard peers on %s: %w", t.cfg.Interface, err)
	}
	return changes, nil
}

func peerConfig(p Peer) wgtypes.PeerConfig {
	ka := p.Keepalive
	pc := wgtypes.PeerConfig{
		PublicKey:                   wgtypes.Key(p.PublicKey),
		PersistentKeepaliveInterval: &ka,
		ReplaceAllowedIPs:           true,
		AllowedIPs:                  allowedIPs(p),
	}
	if p.Endpoint.IsValid() {
		pc.Endpoint = net.UDPAddrFromAddrPort(p.Endpoint)
	}
	return pc
}

// allowedIPs are my views of the peer's networks: what it may send from
// (after its SNAT) and what I send to it.
func allowedIPs(p Peer) []net.IPNet {
	out := make([]net.IPNet, 0, len(p.Views))
	for _, v := range p.Views {
		out = append(out, net.IPNet{IP: v.As.Addr().AsSlice(), Mask: net.CIDRMask(v.As.Bits(), 32)})
	}
	return out
}

func peerMatches(cur wgtypes.Peer, p Peer) bool {
	if cur.PersistentKeepaliveInterval != p.Keepalive {
		return false
	}
	if p.Endpoint.IsValid() && (cur.Endpoint == nil || endpointOf(cur.Endpoint) != p.Endpoint) {
		return false
	}
	var have, want []netip.Prefix
	for _, n := range cur.AllowedIPs {
		have = append(have, prefixOf(&n))
	}
	for _, v := range p.Views {
		want = append(want, v.As)
	}
	cmp := func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr())*64 + a.Bits() - b.Bits() }
	slices.SortFunc(have, cmp)
	slices.SortFunc(want, cmp)
	return slices.Equal(have, want)
}

func endpointOf(a *net.UDPAddr) netip.AddrPort {
	ap := a.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (t *Tunnel) statusLocked() ([]PeerStatus, error) {
	if t.closed {
		return nil, fmt.Errorf("tunnel status: tunnel closed")
	}
	dev, err := t.wg.Device(t.cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("read wireguard device %s: %w", t.cfg.Interface, err)
	}
	out := make([]PeerStatus, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		s := PeerStatus{
			ClusterID: t.peerIDs[Key(p.PublicKey)],
			PublicKey: Key(p.PublicKey),
			RxBytes:   p.ReceiveBytes,
			TxBytes:   p.TransmitBytes,
		}
		if p.Endpoint != nil {
			s.Endpoint = endpointOf(p.Endpoint)
		}
		if !p.LastHandshakeTime.IsZero() && p.LastHandshakeTime.Unix() > 0 {
			s.LastHandshake = p.LastHandshakeTime
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int {
		switch {
		case a.ClusterID < b.ClusterID:
			return -1
		case a.ClusterID > b.ClusterID:
			return 1
		}
		return 0
	})
	return out, nil
}
