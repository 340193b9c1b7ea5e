package fabric_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

// masquerades are the shapes of a CNI's masquerade for traffic leaving
// the PodCIDR: flannel's and Calico's through iptables-nft (appended, and
// inserted first), and an nft chain at srcnat and at srcnat - 1.
var masquerades = []struct {
	name    string
	install func(t *testing.T, s *harness.Site)
}{
	{"iptables-append", func(t *testing.T, s *harness.Site) {
		s.MustExec("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", podNet.String(), "!", "-d", podNet.String(), "-j", "MASQUERADE")
	}},
	{"iptables-insert", func(t *testing.T, s *harness.Site) {
		s.MustExec("iptables", "-t", "nat", "-I", "POSTROUTING", "1", "-s", podNet.String(), "!", "-d", podNet.String(), "-j", "MASQUERADE")
	}},
	{"nft-srcnat", func(t *testing.T, s *harness.Site) { nftMasquerade(t, s, "srcnat") }},
	{"nft-priority-99", func(t *testing.T, s *harness.Site) { nftMasquerade(t, s, "99") }},
}

func nftMasquerade(t *testing.T, s *harness.Site, priority string) {
	f := filepath.Join(t.TempDir(), "cni.nft")
	script := fmt.Sprintf(`table ip cni {
	chain post {
		type nat hook postrouting priority %s;
		ip saddr %s ip daddr != %s masquerade
	}
}
`, priority, podNet, podNet)
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	s.MustExec("nft", "-f", f)
}

// A CNI's masquerade on every node, installed before or after the
// fabric, does not rewrite traffic to a view: the peer sees the pod's own
// address. Traffic to anywhere else is still masqueraded, the witness
// that the CNI's rule is in force.
func TestMasqueradeExemption(t *testing.T) {
	for _, m := range masquerades {
		for _, order := range []string{"cni-first", "fabric-first"} {
			t.Run(m.name+"/"+order, func(t *testing.T) {
				c := newCluster(t)
				harness.Require(t, iptables)
				c.gw.ServeTCP(port)
				if order == "fabric-first" {
					c.applyBoth(t)
				}
				m.install(t, c.wk)
				m.install(t, c.gw)
				if order == "cni-first" {
					c.applyBoth(t)
				}

				from, err := c.seen(c.gw.Addr)
				if err != nil {
					t.Fatalf("pod to the gateway node (not a view): %v", err)
				}
				if from != c.wk.Addr {
					t.Fatalf("gateway node saw the pod as %s, want the worker's %s: the CNI's masquerade is not in force, the test proves nothing", from, c.wk.Addr)
				}
				from, err = c.seen(peerAddr)
				if err != nil {
					t.Fatalf("pod to the peer: %v", err)
				}
				if from != podAddr {
					t.Errorf("peer saw the pod as %s, want its own address %s", from, podAddr)
				}
			})
		}
	}
}

// On the gateway the tunnel's own SNAT, at priority 90, still translates
// traffic leaving through the tunnel: it binds before the exemption at
// 95. The stand-in translates the pod network into 10.71.0.0/16 as the
// tunnel's egress does.
func TestTunnelSNATBindsBeforeExemption(t *testing.T) {
	c := newCluster(t)
	c.peer.MustExec("ip", "route", "add", "10.71.0.0/16", "via", "169.254.9.1")
	f := filepath.Join(t.TempDir(), "tunnel.nft")
	script := fmt.Sprintf(`table ip standin {
	chain egress {
		type nat hook postrouting priority 90;
		oifname %q ip saddr %s snat ip prefix to 10.71.0.0/16
	}
}
`, tunnelLink, podNet)
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	c.gw.MustExec("nft", "-f", f)
	c.applyBoth(t)
	from, err := c.seen(peerAddr)
	if err != nil {
		t.Fatalf("pod to the peer: %v", err)
	}
	if want := netip.MustParseAddr("10.71.1.5"); from != want {
		t.Errorf("peer saw the pod as %s, want the tunnel's translation %s", from, want)
	}
}
