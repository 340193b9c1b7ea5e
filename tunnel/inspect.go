package tunnel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Inspection is the tunnel as the kernel holds it right now, read back
// rather than taken from the last desired state, for a person asking why
// a packet does not pass (flotilla trace). It holds public keys only.
type Inspection struct {
	Interface string
	Peers     []InspectedPeer
	NAT       []InspectedNAT
}

// InspectedPeer is one WireGuard peer on the link.
type InspectedPeer struct {
	ClusterID     string // empty: a peer the tunnel does not know
	PublicKey     Key
	Endpoint      netip.AddrPort
	AllowedIPs    []netip.Prefix
	LastHandshake time.Time // zero: never
}

// InspectedNAT is one peer's NAT in the kernel: the views the egress and
// ingress maps send to its chains, and the rules of those chains as their
// comments (each rule's key, NATRule.Key) say.
type InspectedNAT struct {
	Peer    string
	Egress  []netip.Prefix
	Ingress []netip.Prefix
	Rules   []NATRule
}

// Inspect reads the WireGuard device and the NAT table back from the
// kernel.
func (t *Tunnel) Inspect() (Inspection, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return Inspection{}, fmt.Errorf("inspect the tunnel: tunnel closed")
	}
	out := Inspection{Interface: t.cfg.Interface}
	dev, err := t.wg.Device(t.cfg.Interface)
	if err != nil {
		return out, fmt.Errorf("read wireguard device %s: %w", t.cfg.Interface, err)
	}
	for _, p := range dev.Peers {
		ip := InspectedPeer{ClusterID: t.peerIDs[Key(p.PublicKey)], PublicKey: Key(p.PublicKey)}
		if p.Endpoint != nil {
			ip.Endpoint = endpointOf(p.Endpoint)
		}
		if !p.LastHandshakeTime.IsZero() && p.LastHandshakeTime.Unix() > 0 {
			ip.LastHandshake = p.LastHandshakeTime
		}
		for _, a := range p.AllowedIPs {
			if pf, ok := netip.AddrFromSlice(a.IP); ok {
				ones, _ := a.Mask.Size()
				ip.AllowedIPs = append(ip.AllowedIPs, netip.PrefixFrom(pf.Unmap(), ones))
			}
		}
		out.Peers = append(out.Peers, ip)
	}
	c, err := t.nft.conn()
	if err != nil {
		return out, err
	}
	k, err := t.nat.read(c)
	if err != nil {
		t.nft.fail()
		return out, fmt.Errorf("read nftables table %s: %w", t.nat.name, err)
	}
	byPeer := map[string]*InspectedNAT{}
	get := func(peer string) *InspectedNAT {
		if byPeer[peer] == nil {
			byPeer[peer] = &InspectedNAT{Peer: peer}
		}
		return byPeer[peer]
	}
	for _, d := range directions {
		for _, iv := range k.maps[d.vmap] {
			peer, ok := strings.CutPrefix(iv.v.chain, d.base+"-")
			p, pok := iv.Prefix()
			if !ok || !pok {
				continue
			}
			n := get(peer)
			if d.kind == SNAT {
				n.Egress = append(n.Egress, p)
			} else {
				n.Ingress = append(n.Ingress, p)
			}
		}
		for chain, rules := range k.rules {
			peer, ok := strings.CutPrefix(chain, d.base+"-")
			if !ok || chain == d.vmap {
				continue
			}
			for _, r := range rules {
				if nr, ok := parseRuleKey(r.comment, peer); ok {
					get(peer).Rules = append(get(peer).Rules, nr)
				}
			}
		}
	}
	for _, n := range byPeer {
		out.NAT = append(out.NAT, *n)
	}
	slices.SortFunc(out.NAT, func(a, b InspectedNAT) int { return strings.Compare(a.Peer, b.Peer) })
	return out, nil
}

// parseRuleKey reads a rule's comment back (NATRule.Key).
func parseRuleKey(comment, peer string) (NATRule, bool) {
	var kind, match, to string
	rest, ok := strings.CutPrefix(comment, "flotilla peer="+peer+" ")
	if !ok {
		return NATRule{}, false
	}
	if _, err := fmt.Sscanf(rest, "%s %s to %s", &kind, &match, &to); err != nil {
		return NATRule{}, false
	}
	m, err1 := netip.ParsePrefix(match)
	t, err2 := netip.ParsePrefix(to)
	if err1 != nil || err2 != nil || (kind != string(SNAT) && kind != string(DNAT)) {
		return NATRule{}, false
	}
	return NATRule{Kind: NATKind(kind), Match: m, To: t}, true
}
