package harness

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"text/template"
	"time"

	"github.com/vishvananda/netlink"
)

// Masquerade is a CNI's masquerade rules, in the shape flannel or Calico
// installs them on every node, for Node.InstallMasquerade. The zero value
// is none. The rules are rendered for the cluster's pod network (the
// control plane's PodCIDR) and the node's slice of it.
type Masquerade int

const (
	NoMasquerade Masquerade = iota
	// FlannelNFT is flannel's --ip-masq in its nftables mode: table ip
	// flannel-ipv4, chain postrtg. Its rule "saddr != node's slice, daddr
	// cluster: return" comes before the masquerade of other sources to
	// the cluster, so unlike the iptables shape it leaves traffic from
	// outside the pod network to pods on other nodes alone.
	FlannelNFT
	// FlannelIPTables is flannel's --ip-masq with iptables (nft backend):
	// chain FLANNEL-POSTRTG, appended to nat POSTROUTING. It masquerades
	// the pod network to the outside and anything from outside the pod
	// network to pods on other nodes.
	FlannelIPTables
	// CalicoNFT is Calico's natOutgoing IP pool in its nftables dataplane:
	// table ip calico, chain nat-cali-nat-outgoing, sets of the pools.
	CalicoNFT
	// CalicoIPTables is the same with iptables (nft backend): chain
	// cali-nat-outgoing, reached from the top of nat POSTROUTING, matching
	// the ipsets cali40masq-ipam-pools and cali40all-ipam-pools.
	CalicoIPTables
)

// Masquerades are all the shapes, for tests that try each.
var Masquerades = []Masquerade{FlannelNFT, FlannelIPTables, CalicoNFT, CalicoIPTables}

func (m Masquerade) String() string {
	switch m {
	case NoMasquerade:
		return "none"
	case FlannelNFT:
		return "flannel-nft"
	case FlannelIPTables:
		return "flannel-iptables"
	case CalicoNFT:
		return "calico-nft"
	case CalicoIPTables:
		return "calico-iptables"
	}
	return fmt.Sprintf("Masquerade(%d)", int(m))
}

// The rules, as the CNIs write them (flannel: pkg/trafficmngr/{nftables,
// iptables}; Calico: felix/rules/nat.go and its static POSTROUTING
// chains). Flannel's forward-accept chain and Calico's IPIP masquerade are
// left out: neither translates pod traffic here.
var masqueradeRules = map[Masquerade]*template.Template{
	FlannelNFT: template.Must(template.New("flannel-nft").Parse(`
add table ip flannel-ipv4 { comment "rules for flannel-ipv4"; }
add chain ip flannel-ipv4 postrtg { type nat hook postrouting priority srcnat; comment "chain to manage traffic masquerading by flannel"; }
flush chain ip flannel-ipv4 postrtg
add rule ip flannel-ipv4 postrtg meta mark 0x4000 return
add rule ip flannel-ipv4 postrtg ip saddr {{.Node}} ip daddr {{.Cluster}} return
add rule ip flannel-ipv4 postrtg ip saddr {{.Cluster}} ip daddr {{.Node}} return
add rule ip flannel-ipv4 postrtg ip saddr != {{.Node}} ip daddr {{.Cluster}} return
add rule ip flannel-ipv4 postrtg ip saddr {{.Cluster}} ip daddr != 224.0.0.0/4 masquerade fully-random
add rule ip flannel-ipv4 postrtg ip saddr != {{.Cluster}} ip daddr {{.Cluster}} masquerade fully-random
`)),
	FlannelIPTables: template.Must(template.New("flannel-iptables").Parse(`*nat
:FLANNEL-POSTRTG - [0:0]
-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG
-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s {{.Node}} -d {{.Cluster}} -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s {{.Cluster}} -d {{.Node}} -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG ! -s {{.Cluster}} -d {{.Node}} -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s {{.Cluster}} ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully
-A FLANNEL-POSTRTG ! -s {{.Cluster}} -d {{.Cluster}} -m comment --comment "flanneld masq" -j MASQUERADE --random-fully
COMMIT
`)),
	CalicoNFT: template.Must(template.New("calico-nft").Parse(`
add table ip calico
add set ip calico cali40masq-ipam-pools { type ipv4_addr; flags interval; elements = { {{.Cluster}} }; }
add set ip calico cali40all-ipam-pools { type ipv4_addr; flags interval; elements = { {{.Cluster}} }; }
add chain ip calico nat-POSTROUTING { type nat hook postrouting priority srcnat; policy accept; }
add chain ip calico nat-cali-POSTROUTING
add chain ip calico nat-cali-fip-snat
add chain ip calico nat-cali-nat-outgoing
add rule ip calico nat-POSTROUTING jump nat-cali-POSTROUTING
add rule ip calico nat-cali-POSTROUTING jump nat-cali-fip-snat
add rule ip calico nat-cali-POSTROUTING jump nat-cali-nat-outgoing
add rule ip calico nat-cali-nat-outgoing ip saddr @cali40masq-ipam-pools ip daddr != @cali40all-ipam-pools masquerade fully-random
`)),
	CalicoIPTables: template.Must(template.New("calico-iptables").Parse(`*nat
:cali-POSTROUTING - [0:0]
:cali-fip-snat - [0:0]
:cali-nat-outgoing - [0:0]
-I POSTROUTING 1 -m comment --comment "cali:O3lYWMrLQYEMJtB5" -j cali-POSTROUTING
-A cali-POSTROUTING -m comment --comment "cali:Z-c7XtVd2Bq7s_hA" -j cali-fip-snat
-A cali-POSTROUTING -m comment --comment "cali:nYKhEzDlr11Jccal" -j cali-nat-outgoing
-A cali-nat-outgoing -m comment --comment "cali:flqWnvo8yq4ULQLa" -m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE --random-fully
COMMIT
`)),
}

// What RemoveMasquerade takes away: nft tables, or iptables jumps from nat
// POSTROUTING, chains and ipsets.
var (
	masqueradeTables = map[Masquerade]string{FlannelNFT: "flannel-ipv4", CalicoNFT: "calico"}
	masqueradeJumps  = map[Masquerade][]string{
		FlannelIPTables: {"-m", "comment", "--comment", "flanneld masq", "-j", "FLANNEL-POSTRTG"},
		CalicoIPTables:  {"-m", "comment", "--comment", "cali:O3lYWMrLQYEMJtB5", "-j", "cali-POSTROUTING"},
	}
	masqueradeChains = map[Masquerade][]string{
		FlannelIPTables: {"FLANNEL-POSTRTG"},
		CalicoIPTables:  {"cali-POSTROUTING", "cali-fip-snat", "cali-nat-outgoing"},
	}
	calicoIPSets = []string{"cali40masq-ipam-pools", "cali40all-ipam-pools"}
)

// InstallMasquerade installs a CNI's masquerade rules in the node's
// namespace, replacing the same shape's rules if they are there
// (NoMasquerade: nothing). They go
// with the namespace when the test ends; RemoveMasquerade takes them away
// before.
func (n *Node) InstallMasquerade(m Masquerade) error {
	if err := n.installMasquerade(m); err != nil {
		return fmt.Errorf("install %s masquerade on node %s: %w", m, n.NodeName, err)
	}
	return nil
}

func (n *Node) installMasquerade(m Masquerade) error {
	if m == NoMasquerade {
		return nil
	}
	tmpl, ok := masqueradeRules[m]
	if !ok {
		return fmt.Errorf("no such masquerade shape (want one of %v)", Masquerades)
	}
	if err := IPTables.Check(); err != nil && masqueradeJumps[m] != nil {
		return fmt.Errorf("%v; fix: %s", err, IPTables.Fix)
	}
	if err := n.removeMasquerade(m); err != nil {
		return err
	}
	var rules bytes.Buffer
	err := tmpl.Execute(&rules, struct{ Cluster, Node netip.Prefix }{n.cp.Options.PodCIDR, n.PodCIDR})
	if err != nil {
		return err
	}
	if m == CalicoIPTables {
		if err := n.createCalicoIPSets(); err != nil {
			return err
		}
	}
	if _, ok := masqueradeTables[m]; ok {
		return n.execInput(rules.Bytes(), "nft", "-f", "-")
	}
	return n.execInput(rules.Bytes(), "iptables-nft-restore", "-w", "--noflush")
}

// createCalicoIPSets creates the pool sets Calico's iptables rules match
// (hash:net, one entry: the cluster's pool, with natOutgoing).
func (n *Node) createCalicoIPSets() error {
	pool := n.cp.Options.PodCIDR
	for _, set := range calicoIPSets {
		if err := n.nl.IpsetCreate(set, "hash:net", netlink.IpsetCreateOptions{}); err != nil {
			return fmt.Errorf("ipset %s: %w", set, err)
		}
		entry := &netlink.IPSetEntry{IP: net.IP(pool.Addr().AsSlice()), CIDR: uint8(pool.Bits())}
		if err := n.nl.IpsetAdd(set, entry); err != nil {
			return fmt.Errorf("ipset %s: add %s: %w", set, pool, err)
		}
	}
	return nil
}

// RemoveMasquerade removes what InstallMasquerade(m) installed, if
// anything, and leaves every other rule of the node alone.
func (n *Node) RemoveMasquerade(m Masquerade) error {
	if err := n.removeMasquerade(m); err != nil {
		return fmt.Errorf("remove %s masquerade from node %s: %w", m, n.NodeName, err)
	}
	return nil
}

func (n *Node) removeMasquerade(m Masquerade) error {
	if m == NoMasquerade {
		return nil
	}
	if table, ok := masqueradeTables[m]; ok {
		// Adding first makes the delete succeed when there is no table.
		return n.execInput([]byte(fmt.Sprintf("add table ip %s\ndelete table ip %s\n", table, table)), "nft", "-f", "-")
	}
	jump, ok := masqueradeJumps[m]
	if !ok {
		return fmt.Errorf("no such masquerade shape (want one of %v)", Masquerades)
	}
	nat := func(args ...string) error {
		return n.execInput(nil, "iptables-nft", append([]string{"-w", "-t", "nat"}, args...)...)
	}
	for nat(append([]string{"-C", "POSTROUTING"}, jump...)...) == nil {
		if err := nat(append([]string{"-D", "POSTROUTING"}, jump...)...); err != nil {
			return err
		}
	}
	var present []string
	for _, chain := range masqueradeChains[m] {
		if nat("-S", chain) == nil {
			present = append(present, chain)
		}
	}
	// Flush all before deleting any: the chains jump to each other.
	for _, chain := range present {
		if err := nat("-F", chain); err != nil {
			return err
		}
	}
	for _, chain := range present {
		if err := nat("-X", chain); err != nil {
			return err
		}
	}
	if m == CalicoIPTables {
		for _, set := range calicoIPSets {
			if _, err := n.nl.IpsetList(set); err != nil {
				continue
			}
			if err := n.nl.IpsetDestroy(set); err != nil {
				return fmt.Errorf("destroy ipset %s: %w", set, err)
			}
		}
	}
	return nil
}

// execInput runs a command inside the node's namespace with input on its
// standard input.
func (n *Netns) execInput(input []byte, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	cmd.Stdin = bytes.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
