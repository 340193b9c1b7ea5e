package peering

import (
	"fmt"
	"net/netip"
	"testing"
)

// A cluster behind NAT peers with a reachable one: the reachable side
// takes no endpoint from its statement (WireGuard learns it from the
// handshakes), the side behind NAT initiates; both Peers say which side
// is behind NAT. Two clusters behind NAT do not peer and say why.
func TestPeeringBehindNAT(t *testing.T) {
	var net network
	open := newNode(t, &net, nodeOptions{endpoint: netip.MustParseAddrPort("198.18.1.1:51820")})
	behind := newNode(t, &net, nodeOptions{endpoint: netip.MustParseAddrPort("10.9.0.2:51820"), outboundOnly: true})
	meet(open, behind)
	within(t, "connected", func() error { return connected(open, behind) })

	toBehind, _ := open.dp.peer(behind.id.ClusterID())
	if toBehind.Endpoint.IsValid() || toBehind.Initiates {
		t.Errorf("reachable side's tunnel peer behind NAT: endpoint %s, initiates %v; want none, false", toBehind.Endpoint, toBehind.Initiates)
	}
	toOpen, _ := behind.dp.peer(open.id.ClusterID())
	if toOpen.Endpoint != netip.MustParseAddrPort("198.18.1.1:51820") || !toOpen.Initiates || toOpen.Keepalive <= 0 {
		t.Errorf("tunnel peer of the side behind NAT: endpoint %s, initiates %v, keepalive %s; want the statement's, true, on",
			toOpen.Endpoint, toOpen.Initiates, toOpen.Keepalive)
	}
	for _, tt := range []struct {
		n, of  *node
		reason string
	}{{open, behind, "PeerBehindNAT"}, {behind, open, "BehindNAT"}} {
		within(t, "reachable condition", func() error {
			if r := stateOf(tt.n, tt.of).Reachable; !r.OK || r.Reason != tt.reason {
				return fmt.Errorf("reachable %+v, want OK %s", r, tt.reason)
			}
			return nil
		})
	}

	other := newNode(t, &net, nodeOptions{endpoint: netip.MustParseAddrPort("10.8.0.2:51820"), outboundOnly: true})
	meet(behind, other)
	for _, tt := range [][2]*node{{behind, other}, {other, behind}} {
		s := inPhase(t, tt[0], tt[1], PhaseUnreachable)
		if s.Reachable.OK || s.Reachable.Reason != "BothBehindNAT" {
			t.Errorf("both behind NAT: reachable %+v, want not OK, BothBehindNAT", s.Reachable)
		}
		if _, ok := tt[0].dp.peer(tt[1].id.ClusterID()); ok {
			t.Errorf("a tunnel peer between two clusters behind NAT")
		}
	}
}
