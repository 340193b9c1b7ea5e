package tunnel

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The forward chain of our table holds what applies to every packet the
// gateway forwards through our link, whichever peer it is for:
//
//	chain forward { type filter hook forward priority mangle;
//	                iifname IF oifname IF counter drop
//	                oifname IF tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
//	                iifname IF tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu }
//
// The first rule is the guard: a packet that came out of the tunnel never
// goes back into it. Nothing legitimate does that (every cluster peers
// with every other directly; a gateway is no transit), and without the
// guard a gateway that lacks its translation for a peer, for the moment a
// replica taking over has its WireGuard peers before its NAT, or while an
// operator's hand is in the table, would route the peer's packet for one
// of our pods back to the peer whenever the two clusters see each other
// under the same range; the peer then hands it to its own pod at that
// address, and a connection meant for another cluster is answered inside
// its own. Its counter is what `nft list chain ip <table> forward` shows
// an operator.
//
// The other two clamp the MSS: TCP SYNs (and SYN-ACKs) into and out of the
// link announce at most what the route's MTU carries.
// The WireGuard link's MTU is below the pods' (WireGuard's overhead), and
// where ICMP "fragmentation needed" is dropped on the path, as firewalls
// often do, path MTU discovery never tells the pods: their full-sized
// segments vanish and bulk transfers stall. The kernel takes the lower
// MTU of the routes to the packet's destination and back to its source,
// and never raises an MSS.
const (
	// chainForward holds forwardRules.
	chainForward = "forward"
	// hairpinComment tags the guard; tests read its counter.
	hairpinComment = "flotilla never forward from the tunnel back into it"
)

// forwardRules are the forward chain's rules by comment, in order.
var forwardRules = []struct {
	comment string
	exprs   func(ifname string) []expr.Any
}{
	{hairpinComment, hairpinExprs},
	{"flotilla clamp tcp mss into the tunnel", func(ifname string) []expr.Any { return mssExprs(ifname, expr.MetaKeyOIFNAME) }},
	{"flotilla clamp tcp mss out of the tunnel", func(ifname string) []expr.Any { return mssExprs(ifname, expr.MetaKeyIIFNAME) }},
}

func forwardChain(t *nftables.Table) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle, Policy: &accept}
}

// resyncForward queues what makes the forward chain exactly
// forwardRules, given the table as read back, and returns how many
// objects that changes.
func (n *natTable) resyncForward(c *nftables.Conn, t *nftables.Table, k kernelNAT) int {
	ch := forwardChain(t)
	var have, want []string
	for _, r := range k.rules[chainForward] {
		have = append(have, r.comment)
	}
	for _, r := range forwardRules {
		want = append(want, r.comment)
	}
	changes := 0
	switch {
	case k.chains[chainForward] == nil:
		c.AddChain(ch)
		changes++
	case slices.Equal(have, want):
		return 0
	default:
		c.FlushChain(ch)
	}
	for _, r := range forwardRules {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs(n.ifname),
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
		changes++
	}
	return changes
}

// hairpinDropped reads the guard's counter: what came out of the tunnel
// and was kept from going back in, since the forward chain was made.
func (n *natTable) hairpinDropped() (Dropped, error) {
	c, err := n.nft.conn()
	if err != nil {
		return Dropped{}, err
	}
	t := n.table()
	rules, err := c.GetRules(t, forwardChain(t))
	if err != nil {
		n.nft.fail()
		return Dropped{}, fmt.Errorf("read the counter of %s/%s: %w", n.name, chainForward, err)
	}
	for _, r := range rules {
		if comment, _ := userdata.GetString(r.UserData, userdata.TypeComment); comment != hairpinComment {
			continue
		}
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				return Dropped{Packets: ctr.Packets, Bytes: ctr.Bytes}, nil
			}
		}
	}
	return Dropped{}, fmt.Errorf("no rule %q in %s/%s", hairpinComment, n.name, chainForward)
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
