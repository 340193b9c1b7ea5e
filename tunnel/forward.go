package tunnel

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Three chains of our table apply to every packet through our link,
// whichever peer it is for:
//
//	chain forward { type filter hook forward priority mangle;
//	                iifname IF oifname IF counter drop
//	                iifname IF jump beyond
//	                oifname IF tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
//	                iifname IF tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu }
//	chain input   { type filter hook input priority mangle;
//	                iifname IF jump beyond }
//	chain beyond  { ip daddr <each of my networks> return
//	                counter drop }
//
// The first rule is the hairpin guard: a packet that came out of the
// tunnel never goes back into it. Nothing legitimate does that (every
// cluster peers with every other directly; a gateway is no transit), and
// without the guard a gateway that lacks its translation for a peer, for
// the moment a replica taking over has its WireGuard peers before its NAT,
// or while an operator's hand is in the table, would route the peer's
// packet for one of our pods back to the peer whenever the two clusters
// see each other under the same range; the peer then hands it to its own
// pod at that address, and a connection meant for another cluster is
// answered inside its own.
//
// The jumps to beyond keep a peer to my networks: WireGuard checks only
// the source of what a peer sends, so a peer that routes any destination
// into its tunnel (its agent compromised, its WireGuard edited by hand)
// would otherwise have this gateway forward it to a host of the node
// network, a cloud's metadata address or the internet, or deliver it to
// the gateway host's own addresses. Both hooks run after prerouting, so
// the destination is already translated to my real address; replies to
// my own connections are translated back to one of my networks there too.
//
// The last two clamp the MSS: TCP SYNs (and SYN-ACKs) into and out of the
// link announce at most what the route's MTU carries.
// The WireGuard link's MTU is below the pods' (WireGuard's overhead), and
// where ICMP "fragmentation needed" is dropped on the path, as firewalls
// often do, path MTU discovery never tells the pods: their full-sized
// segments vanish and bulk transfers stall. The kernel takes the lower
// MTU of the routes to the packet's destination and back to its source,
// and never raises an MSS.
//
// The drops' counters are flotilla_tunnel_hairpin_dropped_packets_total
// and flotilla_tunnel_beyond_dropped_packets_total.
const (
	chainForward = "forward"
	chainInput   = "input"
	chainBeyond  = "beyond"
	// hairpinComment and beyondComment tag the drops; tests and the
	// metrics read their counters.
	hairpinComment = "flotilla never forward from the tunnel back into it"
	beyondComment  = "flotilla drop what is for none of my networks"
	jumpComment    = "flotilla from the tunnel only to my networks"
)

// fixedRule is a rule of the chains whose content depends only on the
// link and my networks, by comment.
type fixedRule struct {
	comment string
	exprs   []expr.Any
}

// fixedChain is one of those chains with its rules, in order.
type fixedChain struct {
	chain *nftables.Chain
	rules []fixedRule
}

// fixedChains are those chains, in the order they are made: beyond
// before the chains that jump to it.
func (n *natTable) fixedChains(t *nftables.Table, networks []netip.Prefix) []fixedChain {
	var beyond []fixedRule
	for _, p := range networks {
		beyond = append(beyond, fixedRule{"flotilla my network " + p.String(),
			append(matchPrefix(16, p), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	beyond = append(beyond, fixedRule{beyondComment, []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}})
	jump := fixedRule{jumpComment, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n.ifname)},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainBeyond},
	}}
	return []fixedChain{
		{&nftables.Chain{Name: chainBeyond, Table: t}, beyond},
		{hookChain(t, chainForward, nftables.ChainHookForward), []fixedRule{
			{hairpinComment, hairpinExprs(n.ifname)},
			jump,
			{"flotilla clamp tcp mss into the tunnel", mssExprs(n.ifname, expr.MetaKeyOIFNAME)},
			{"flotilla clamp tcp mss out of the tunnel", mssExprs(n.ifname, expr.MetaKeyIIFNAME)},
		}},
		{hookChain(t, chainInput, nftables.ChainHookInput), []fixedRule{jump}},
	}
}

// hookChain is a base chain of ours of type filter at priority mangle:
// before any filter of the host's or a CNI's.
func hookChain(t *nftables.Table, name string, hook *nftables.ChainHook) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: nftables.ChainPriorityMangle, Policy: &accept}
}

// resyncFixed queues what makes the fixed chains exactly their rules for
// networks, given the table as read back, and returns how many objects
// that changes.
func (n *natTable) resyncFixed(c *nftables.Conn, t *nftables.Table, k kernelNAT, networks []netip.Prefix) int {
	changes := 0
	for _, f := range n.fixedChains(t, networks) {
		var have, want []string
		for _, r := range k.rules[f.chain.Name] {
			have = append(have, r.comment)
		}
		for _, r := range f.rules {
			want = append(want, r.comment)
		}
		switch {
		case k.chains[f.chain.Name] == nil:
			c.AddChain(f.chain)
			changes++
		case slices.Equal(have, want):
			continue
		default:
			c.FlushChain(f.chain)
		}
		for _, r := range f.rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: f.chain, Exprs: r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
			changes++
		}
	}
	return changes
}

// dropped reads the counter of the rule with comment in chain: what it
// dropped since the chain was made.
func (n *natTable) dropped(chain, comment string) (Dropped, error) {
	c, err := n.nft.conn()
	if err != nil {
		return Dropped{}, err
	}
	t := n.table()
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if err != nil {
		n.nft.fail()
		return Dropped{}, fmt.Errorf("read the counter of %s/%s: %w", n.name, chain, err)
	}
	for _, r := range rules {
		if got, _ := userdata.GetString(r.UserData, userdata.TypeComment); got != comment {
			continue
		}
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				return Dropped{Packets: ctr.Packets, Bytes: ctr.Bytes}, nil
			}
		}
	}
	return Dropped{}, fmt.Errorf("no rule %q in %s/%s", comment, n.name, chain)
}

// hairpinExprs renders
//
//	iifname IF oifname IF counter drop
func hairpinExprs(ifname string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(ifname)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(ifname)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// mssExprs renders
//
//	oifname|iifname IF tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
func mssExprs(ifname string, iface expr.MetaKey) []expr.Any {
	const tcpFlagsOffset, syn, rst = 13, 0x02, 0x04
	return []expr.Any{
		&expr.Meta{Key: iface, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(ifname)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: tcpFlagsOffset, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{syn | rst}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{syn}},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{SourceRegister: 1, Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2}, // kind 2: MSS
	}
}
