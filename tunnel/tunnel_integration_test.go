package tunnel_test

import (
	"net/netip"
	"testing"
)

// Three sites share 10.0.0.0/16 and a fourth uses 10.9.0.0/16: every pod
// reaches every other pod at the address its own cluster gives it (ICMP and
// TCP, both directions), and the receiving pod sees the sender under its
// own cluster's view of the sender.
func TestMeshOverlappingPodCIDRs(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16", "10.0.0.0/16", "10.9.0.0/16")
	m.applyFullMesh()
	for _, s := range m.sites {
		s.pod.ServeTCP(8080)
	}
	for _, from := range m.sites {
		for _, to := range m.others(from) {
			dst := from.seenFrom(to)
			if err := from.pod.Ping(dst); err != nil {
				t.Errorf("%s -> %s: %v", from.name, to.name, err)
				continue
			}
			seen, err := from.pod.TCPExchange(netip.AddrPortFrom(dst, 8080))
			if err != nil {
				t.Errorf("%s -> %s over TCP: %v", from.name, to.name, err)
				continue
			}
			if want := to.seenFrom(from); seen != want {
				t.Errorf("%s -> %s: receiver saw the sender as %s, want %s (its view of %s)", from.name, to.name, seen, want, from.name)
			}
		}
	}
}
