package tunnel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The NAT lives in an nftables table of our own with two base chains. Each
// rule carries its NATRule key as comment: that is how the reconciler
// recognises its rules and finds the difference to the desired set.
const (
	chainEgress  = "egress"
	chainIngress = "ingress"
)

// natTable reconciles the NAT table.
type natTable struct {
	name   string // nftables table name, family ip
	ifname string // the WireGuard interface the rules match on
}

func (n natTable) table() *nftables.Table {
	return &nftables.Table{Name: n.name, Family: nftables.TableFamilyIPv4}
}

func (n natTable) chains(t *nftables.Table) (egress, ingress *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	egress = &nftables.Chain{
		Name: chainEgress, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept,
	}
	ingress = &nftables.Chain{
		Name: chainIngress, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept,
	}
	return egress, ingress
}

// reconcile makes the table hold exactly the given rules, in one atomic
// transaction, and reports how many objects it added or removed. Rules
// already present are left alone, so adding a peer adds only its rules.
func (n natTable) reconcile(c *nftables.Conn, rules []NATRule) (int, error) {
	t := n.table()
	egress, ingress := n.chains(t)
	want := map[string]map[string]NATRule{chainEgress: {}, chainIngress: {}}
	for _, r := range rules {
		want[chainFor(r.Kind)][r.Key()] = r
	}

	exists, err := tableExists(c, n.name)
	if err != nil {
		return 0, err
	}
	haveChains := map[string]bool{}
	if exists {
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		if err != nil {
			return 0, fmt.Errorf("list nftables chains: %w", err)
		}
		for _, ch := range chains {
			if ch.Table.Name == n.name {
				haveChains[ch.Name] = true
			}
		}
	}
	changes := 0
	if !exists {
		c.AddTable(t)
		changes++
	}
	for _, ch := range []*nftables.Chain{egress, ingress} {
		if !haveChains[ch.Name] {
			c.AddChain(ch)
			changes++
			continue
		}
		have, err := c.GetRules(t, ch)
		if err != nil {
			return 0, fmt.Errorf("list rules of %s/%s: %w", n.name, ch.Name, err)
		}
		for _, r := range have {
			key, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			if _, ok := want[ch.Name][key]; ok {
				delete(want[ch.Name], key) // present: keep it, do not add it again
				continue
			}
			// Not desired, a duplicate, or put into our table by someone else.
			if err := c.DelRule(&nftables.Rule{Table: t, Chain: ch, Handle: r.Handle}); err != nil {
				return 0, fmt.Errorf("delete rule %d of %s/%s: %w", r.Handle, n.name, ch.Name, err)
			}
			changes++
		}
	}
	for _, r := range rules {
		ch := egress
		if r.Kind == DNAT {
			ch = ingress
		}
		if _, missing := want[ch.Name][r.Key()]; !missing {
			continue
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: n.exprs(r), UserData: userdata.AppendString(nil, userdata.TypeComment, r.Key())})
		changes++
	}
	if changes == 0 {
		return 0, nil
	}
	if err := c.Flush(); err != nil {
		return 0, fmt.Errorf("apply nftables table %s: %w", n.name, err)
	}
	return changes, nil
}

// remove deletes the whole table; a missing table is not an error.
func (n natTable) remove(c *nftables.Conn) error {
	exists, err := tableExists(c, n.name)
	if err != nil || !exists {
		return err
	}
	c.DelTable(n.table())
	if err := c.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete nftables table %s: %w", n.name, err)
	}
	return nil
}

// nftSocketBuffer is the netlink socket buffer size: a batch for 1000 peers
// gets one acknowledgement per rule, more than the default buffer holds.
const nftSocketBuffer = 16 << 20

// newNFTConn returns a connection that opens a fresh netlink socket per
// operation (so a failed batch cannot leave a socket out of step) with
// buffers large enough for thousands of rules in one transaction.
func newNFTConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *netlink.Conn) error {
		if err := c.SetReadBuffer(nftSocketBuffer); err != nil {
			return err
		}
		return c.SetWriteBuffer(nftSocketBuffer)
	}))
}

func tableExists(c *nftables.Conn, name string) (bool, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name {
			return true, nil
		}
	}
	return false, nil
}

func chainFor(k NATKind) string {
	if k == DNAT {
		return chainIngress
	}
	return chainEgress
}

// exprs renders r as nftables expressions, equivalent to
//
//	oifname IF ip saddr SRC ip daddr DST snat ip prefix to TO
//	iifname IF ip saddr SRC ip daddr DST dnat ip prefix to TO
func (n natTable) exprs(r NATRule) []expr.Any {
	iface := expr.MetaKeyOIFNAME
	natType := expr.NATTypeSourceNAT
	if r.Kind == DNAT {
		iface = expr.MetaKeyIIFNAME
		natType = expr.NATTypeDestNAT
	}
	e := []expr.Any{
		&expr.Meta{Key: iface, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n.ifname)},
	}
	e = append(e, matchPrefix(12, r.Source)...)
	e = append(e, matchPrefix(16, r.Destination)...)
	return append(e,
		&expr.Immediate{Register: 1, Data: r.To.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: lastAddr(r.To).AsSlice()},
		&expr.NAT{Type: natType, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 2, Prefix: true},
	)
}

// matchPrefix compares the IPv4 address at offset of the network header
// with p.
func matchPrefix(offset uint32, p netip.Prefix) []expr.Any {
	if p.Bits() == 0 {
		return nil
	}
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
	cmp := &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()}
	if p.Bits() == 32 {
		return []expr.Any{load, cmp}
	}
	mask := net.CIDRMask(p.Bits(), 32)
	return []expr.Any{load,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		cmp,
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(a)
}

func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}
