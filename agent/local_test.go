package agent

import (
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/ipam"
)

func openLedger(t *testing.T) *ipam.Ledger {
	t.Helper()
	l, err := ipam.Open(filepath.Join(t.TempDir(), ipam.FileName), ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLocalNetworksGathered(t *testing.T) {
	pod, svc, rsv, node := ipam.PodNetwork, ipam.ServiceNetwork, ipam.ReservedNetwork, ipam.NodeNetwork
	local := func(p string, k ipam.NetworkKind) ipam.LocalNetwork {
		return ipam.LocalNetwork{Range: netip.MustParsePrefix(p), Kind: k}
	}
	for _, tt := range []struct {
		name      string
		cluster   []ipam.LocalNetwork
		gateway   string
		connected []string
		nodes     []string
		want      []ipam.LocalNetwork
	}{{
		name:      "every source counts",
		cluster:   []ipam.LocalNetwork{local("10.244.0.0/16", pod), local("10.96.0.0/12", svc), local("172.30.0.0/16", rsv)},
		gateway:   "203.0.113.7", // behind NAT: on no interface here
		connected: []string{"192.168.0.0/16", "fd00:1::/64"},
		nodes:     []string{"172.20.5.5/32", "2001:db8::5/128"},
		want: []ipam.LocalNetwork{
			local("10.96.0.0/12", svc), local("10.244.0.0/16", pod), local("172.20.5.5/32", node), local("172.30.0.0/16", rsv),
			local("192.168.0.0/16", node), local("203.0.113.7/32", node), local("2001:db8::5/128", node), local("fd00:1::/64", node),
		},
	}, {
		name:      "node addresses inside a wider local network add nothing",
		cluster:   []ipam.LocalNetwork{local("10.244.0.0/16", pod), local("10.96.0.0/12", svc)},
		gateway:   "192.168.1.10",
		connected: []string{"192.168.1.0/24", "10.96.0.1/32", "10.244.3.0/24", "192.168.0.0/16"},
		nodes:     []string{"192.168.1.11/32", "192.168.7.1/32"},
		want:      []ipam.LocalNetwork{local("10.96.0.0/12", svc), local("10.244.0.0/16", pod), local("192.168.0.0/16", node)},
	}, {
		name:    "a reserved range equal to the pod range is listed once",
		cluster: []ipam.LocalNetwork{local("10.244.0.0/16", pod), local("10.96.0.0/12", svc), local("10.244.0.0/16", rsv)},
		gateway: "10.244.0.1",
		want:    []ipam.LocalNetwork{local("10.96.0.0/12", svc), local("10.244.0.0/16", pod)},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			n := &localNetworks{
				cluster: tt.cluster, gateway: netip.MustParseAddr(tt.gateway),
				connected: func() ([]netip.Prefix, error) { return prefixes(tt.connected...), nil },
				nodes:     func() []netip.Prefix { return prefixes(tt.nodes...) },
			}
			got, err := n.current()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got  %v\nwant %v", got, tt.want)
			}
		})
	}
}

// A view that comes to overlap a node's network or address moves out of
// it, once, and the caller learns how many moved.
func TestLocalNetworksRemapViews(t *testing.T) {
	ledger := openLedger(t)
	const peer = "peer-b"
	lan := netip.MustParsePrefix("192.168.2.0/24")
	if v, err := ledger.ViewOf(peer, lan); err != nil || v != lan {
		t.Fatalf("view before the node network is known: %v %v, want %v", v, err, lan)
	}
	var nodes []netip.Prefix
	n := &localNetworks{
		log: quietLog(), ledger: ledger, gateway: netip.MustParseAddr("192.168.0.1"),
		cluster:   []ipam.LocalNetwork{{Range: netip.MustParsePrefix("10.244.0.0/16"), Kind: ipam.PodNetwork}},
		connected: func() ([]netip.Prefix, error) { return prefixes("192.168.0.0/16"), nil },
		nodes:     func() []netip.Prefix { return nodes },
	}
	moved, err := n.update()
	if err != nil || moved != 1 {
		t.Fatalf("update: moved %d, %v; want 1", moved, err)
	}
	v, _ := ledger.ViewOf(peer, lan)
	if v.Overlaps(netip.MustParsePrefix("192.168.0.0/16")) {
		t.Fatalf("view %s still inside the node network", v)
	}

	other := netip.MustParsePrefix("172.31.0.0/24")
	if v, err := ledger.ViewOf(peer, other); err != nil || v != other {
		t.Fatalf("view of %s: %v %v", other, v, err)
	}
	if moved, err := n.update(); err != nil || moved != 0 {
		t.Fatalf("update without a change: moved %d, %v; want 0", moved, err)
	}
	nodes = prefixes("172.31.0.9/32") // a Node joins with an address in that range
	if moved, err := n.update(); err != nil || moved != 1 {
		t.Fatalf("update after a Node joined: moved %d, %v; want 1", moved, err)
	}
	if v, _ := ledger.ViewOf(peer, other); v.Contains(netip.MustParseAddr("172.31.0.9")) {
		t.Fatalf("view %s still holds the Node's address", v)
	}
}
