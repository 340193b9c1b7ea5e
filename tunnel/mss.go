package tunnel

import (
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// mssRules are the MSS clamp's rules by comment: TCP SYNs (and SYN-ACKs)
// into and out of our link announce at most what the route's MTU carries.
// The WireGuard link's MTU is below the pods' (WireGuard's overhead), and
// where ICMP "fragmentation needed" is dropped on the path, as firewalls
// often do, path MTU discovery never tells the pods: their full-sized
// segments vanish and bulk transfers stall. The kernel takes the lower
// MTU of the routes to the packet's destination and back to its source,
// and never raises an MSS.
var mssRules = []struct {
	comment string
	iface   expr.MetaKey
}{
	{"flotilla clamp tcp mss into the tunnel", expr.MetaKeyOIFNAME},
	{"flotilla clamp tcp mss out of the tunnel", expr.MetaKeyIIFNAME},
}

func mssChain(t *nftables.Table) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: chainMSS, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle, Policy: &accept}
}

// resyncMSS queues what makes the MSS chain exactly mssRules, given the
// table as read back, and returns how many objects that changes.
func (n *natTable) resyncMSS(c *nftables.Conn, t *nftables.Table, k kernelNAT) int {
	ch := mssChain(t)
	var have, want []string
	for _, r := range k.rules[chainMSS] {
		have = append(have, r.comment)
	}
	for _, r := range mssRules {
		want = append(want, r.comment)
	}
	changes := 0
	switch {
	case k.chains[chainMSS] == nil:
		c.AddChain(ch)
		changes++
	case slices.Equal(have, want):
		return 0
	default:
		c.FlushChain(ch)
	}
	for _, r := range mssRules {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: n.mssExprs(r.iface),
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
		changes++
	}
	return changes
}

// mssExprs renders
//
//	oifname|iifname IF tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
func (n *natTable) mssExprs(iface expr.MetaKey) []expr.Any {
	const tcpFlagsOffset, syn, rst = 13, 0x02, 0x04
	return []expr.Any{
		&expr.Meta{Key: iface, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n.ifname)},
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
