package harness

import (
	"net/netip"
	"slices"
	"testing"
)

// Lines as /proc/net/nf_conntrack has them on a NAT router: a's
// WireGuard flow mapped to port 48123, its gossip to two peers, and a
// TCP connection.
const conntrackTable = `ipv4     2 udp      17 174 src=198.18.5.2 dst=198.18.3.4 sport=51820 dport=51820 src=198.18.3.4 dst=198.18.3.9 sport=51820 dport=48123 [ASSURED] mark=0 zone=0 use=2
ipv4     2 udp      17 29 src=198.18.5.2 dst=198.18.3.4 sport=7946 dport=7946 src=198.18.3.4 dst=198.18.3.9 sport=7946 dport=33001 mark=0 zone=0 use=2
ipv4     2 udp      17 29 src=198.18.5.2 dst=198.18.3.5 sport=7946 dport=7946 src=198.18.3.5 dst=198.18.3.9 sport=7946 dport=33002 mark=0 zone=0 use=2
ipv4     2 tcp      6 431999 ESTABLISHED src=198.18.5.2 dst=198.18.3.4 sport=7946 dport=7946 src=198.18.3.4 dst=198.18.3.9 sport=7946 dport=40000 [ASSURED] mark=0 zone=0 use=2
ipv4     2 udp      17 20 src=198.18.5.3 dst=198.18.3.4 sport=51820 dport=51820 [UNREPLIED] src=198.18.3.4 dst=198.18.3.9 sport=51820 dport=51000 mark=0 zone=0 use=2
`

func TestNATMappings(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name   string
		proto  string
		inside netip.AddrPort
		want   []netip.AddrPort
	}{
		{"one flow", "udp", ap("198.18.5.2:51820"), []netip.AddrPort{ap("198.18.3.9:48123")}},
		{"a flow per peer", "udp", ap("198.18.5.2:7946"), []netip.AddrPort{ap("198.18.3.9:33001"), ap("198.18.3.9:33002")}},
		{"by protocol", "tcp", ap("198.18.5.2:7946"), []netip.AddrPort{ap("198.18.3.9:40000")}},
		{"unreplied too", "udp", ap("198.18.5.3:51820"), []netip.AddrPort{ap("198.18.3.9:51000")}},
		{"none", "udp", ap("198.18.5.9:51820"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := natMappings(conntrackTable, tc.proto, tc.inside); !slices.Equal(got, tc.want) {
				t.Errorf("natMappings(%s %s) = %v, want %v", tc.proto, tc.inside, got, tc.want)
			}
		})
	}
}
