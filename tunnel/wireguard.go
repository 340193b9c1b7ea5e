package tunnel

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// wgRecord is what our last configuration left on the device.
type wgRecord struct {
	key   Key
	port  int
	peers map[Key]Peer
}

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
		t.wgApplied = nil
		return fmt.Errorf("configure wireguard device %s: %w", t.cfg.Interface, err)
	}
	if t.wgApplied != nil {
		t.wgApplied.key, t.wgApplied.port = t.key, t.cfg.ListenPort
	}
	return nil
}

// configurePeers makes the device hold exactly the desired peers. Every
// peer on our device is ours. Only peers that differ are sent, never the
// whole list: from the record of the last configuration, or, with full
// set or no record, from the device as read back.
func (t *Tunnel) configurePeers(d Desired, full bool) (int, error) {
	ids := make(map[Key]string, len(d.Peers))
	contacts := make(map[Key]FirstContact, len(d.Peers))
	for _, p := range d.Peers {
		ids[p.PublicKey] = p.ClusterID
		contacts[p.PublicKey] = p.FirstContact
	}
	t.peerIDs, t.contacts = ids, contacts
	if !full && t.wgApplied != nil {
		if n, err := t.updatePeers(d); err == nil {
			return n, nil
		}
	}
	return t.resyncPeers(d)
}

// removeDeparted takes the peers d no longer has off the device, before
// their translation and filter go: a peer can send nothing once those
// are gone. From the record, or the device as read back without one.
func (t *Tunnel) removeDeparted(d Desired) (int, error) {
	want := make(map[Key]bool, len(d.Peers))
	for _, p := range d.Peers {
		want[p.PublicKey] = true
	}
	var have []Key
	if t.wgApplied != nil {
		for k := range t.wgApplied.peers {
			have = append(have, k)
		}
	} else {
		dev, err := t.wg.Device(t.cfg.Interface)
		if err != nil {
			return 0, fmt.Errorf("read wireguard device %s: %w", t.cfg.Interface, err)
		}
		for _, p := range dev.Peers {
			have = append(have, Key(p.PublicKey))
		}
	}
	var cfg wgtypes.Config
	for _, k := range have {
		if !want[k] {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: wgtypes.Key(k), Remove: true})
		}
	}
	if len(cfg.Peers) == 0 {
		return 0, nil
	}
	if err := t.wg.ConfigureDevice(t.cfg.Interface, cfg); err != nil {
		t.wgApplied = nil
		return 0, fmt.Errorf("remove wireguard peers from %s: %w", t.cfg.Interface, err)
	}
	if t.wgApplied != nil {
		for _, pc := range cfg.Peers {
			delete(t.wgApplied.peers, Key(pc.PublicKey))
		}
	}
	return len(cfg.Peers), nil
}

// updatePeers sends the difference between the record and d.
func (t *Tunnel) updatePeers(d Desired) (int, error) {
	rec := t.wgApplied
	var cfg wgtypes.Config
	changes := 0
	if rec.key != t.key {
		k := wgtypes.Key(t.key)
		cfg.PrivateKey = &k
		changes++
	}
	if rec.port != t.cfg.ListenPort {
		cfg.ListenPort = &t.cfg.ListenPort
		changes++
	}
	now := time.Now()
	peers := make(map[Key]Peer, len(d.Peers))
	for _, p := range d.Peers {
		old, ok := rec.peers[p.PublicKey]
		if !ok {
			t.holdFirstContact(p, now)
		}
		p = t.effective(p)
		peers[p.PublicKey] = p
		switch {
		case ok && samePeer(old, p):
			continue
		case ok && samePeer(old, withKeepalive(p, old.Keepalive)):
			cfg.Peers = append(cfg.Peers, keepaliveConfig(p))
		default:
			cfg.Peers = append(cfg.Peers, peerConfig(p))
		}
		changes++
	}
	for k := range rec.peers {
		if _, ok := peers[k]; !ok {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: wgtypes.Key(k), Remove: true})
			changes++
		}
	}
	t.forgetFirstContacts(peers)
	if changes == 0 {
		return 0, nil
	}
	if err := t.wg.ConfigureDevice(t.cfg.Interface, cfg); err != nil {
		t.wgApplied = nil
		return 0, fmt.Errorf("configure wireguard peers on %s: %w", t.cfg.Interface, err)
	}
	t.wgApplied = &wgRecord{key: t.key, port: t.cfg.ListenPort, peers: peers}
	return changes, nil
}

// resyncPeers reads the device back and sends what differs from d.
func (t *Tunnel) resyncPeers(d Desired) (int, error) {
	t.wgApplied = nil
	dev, err := t.wg.Device(t.cfg.Interface)
	if err != nil {
		return 0, fmt.Errorf("read wireguard device %s: %w", t.cfg.Interface, err)
	}
	now := time.Now()
	t.settleFirstContacts(dev, now)
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
	peers := make(map[Key]Peer, len(d.Peers))
	for _, p := range d.Peers {
		cur, ok := have[p.PublicKey]
		delete(have, p.PublicKey)
		if !ok {
			t.holdFirstContact(p, now)
		}
		p = t.effective(p)
		peers[p.PublicKey] = p
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
	t.forgetFirstContacts(peers)
	if changes > 0 {
		if err := t.wg.ConfigureDevice(t.cfg.Interface, cfg); err != nil {
			return 0, fmt.Errorf("configure wireguard peers on %s: %w", t.cfg.Interface, err)
		}
	}
	t.wgApplied = &wgRecord{key: t.key, port: t.cfg.ListenPort, peers: peers}
	return changes, nil
}

// samePeer reports whether a and b configure the same WireGuard peer.
func samePeer(a, b Peer) bool {
	if a.Endpoint != b.Endpoint || a.Keepalive != b.Keepalive || len(a.Views) != len(b.Views) {
		return false
	}
	return slices.Equal(viewPrefixes(a), viewPrefixes(b))
}

func viewPrefixes(p Peer) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(p.Views))
	for _, v := range p.Views {
		out = append(out, v.As)
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func withKeepalive(p Peer, ka time.Duration) Peer {
	p.Keepalive = ka
	return p
}

// keepaliveConfig changes only the keepalive of an existing peer.
func keepaliveConfig(p Peer) wgtypes.PeerConfig {
	ka := p.Keepalive
	return wgtypes.PeerConfig{PublicKey: wgtypes.Key(p.PublicKey), UpdateOnly: true, PersistentKeepaliveInterval: &ka}
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
	have := make([]netip.Prefix, 0, len(cur.AllowedIPs))
	for _, n := range cur.AllowedIPs {
		have = append(have, prefixOf(&n))
	}
	slices.SortFunc(have, comparePrefix)
	return slices.Equal(have, viewPrefixes(p))
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
