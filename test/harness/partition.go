package harness

import (
	"context"
	"fmt"
	"net/netip"
)

// Cut unplugs the member at addr from the LAN: the bridge drops every IPv4
// packet from or to it (an nftables set in the LAN's namespace, bridge
// family, so no br_netfilter is needed) until Heal. Its own API server,
// reached from the host, stays reachable, as a site's would.
func (l *LAN) Cut(addr netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cutReady {
		for _, args := range [][]string{
			{"add", "table", "bridge", "flotest_cut"},
			{"add", "set", "bridge", "flotest_cut", "cut", "{ type ipv4_addr; }"},
			{"add", "chain", "bridge", "flotest_cut", "forward", "{ type filter hook forward priority 0; policy accept; }"},
			{"add", "rule", "bridge", "flotest_cut", "forward", "ip", "saddr", "@cut", "drop"},
			{"add", "rule", "bridge", "flotest_cut", "forward", "ip", "daddr", "@cut", "drop"},
		} {
			if _, err := l.ns.Exec(context.Background(), "nft", args...); err != nil {
				return fmt.Errorf("LAN partition table: %w", err)
			}
		}
		l.cutReady = true
	}
	if _, err := l.ns.Exec(context.Background(), "nft", "add", "element", "bridge", "flotest_cut", "cut", "{ "+addr.String()+" }"); err != nil {
		return fmt.Errorf("cut %s from the LAN: %w", addr, err)
	}
	return nil
}

// Heal plugs the member at addr back into the LAN.
func (l *LAN) Heal(addr netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.ns.Exec(context.Background(), "nft", "delete", "element", "bridge", "flotest_cut", "cut", "{ "+addr.String()+" }"); err != nil {
		return fmt.Errorf("heal %s on the LAN: %w", addr, err)
	}
	return nil
}
