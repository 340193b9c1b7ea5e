package fabric

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/flotilla-io/flotilla/internal/nftinterval"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The masquerade exemption: one table of ours (family ip), one interval
// set of the views, one NAT chain at srcnat - 5 with two identity SNAT
// rules (see the package comment for why). On the gateway node the same
// table holds the guard: two filter chains, on forward and output, that
// drop traffic to a view leaving through anything but the tunnel.
const (
	chainExempt    = "exempt"
	chainGuardFwd  = "guard-forward"
	chainGuardOut  = "guard-output"
	setViews       = "views"
	exemptPriority = 95
	// The rules' comments name their purpose in `nft list` and tell the
	// rules apart when read back.
	commentToView   = "flotilla fabric: traffic to a view keeps its source address (no CNI masquerade)"
	commentFromView = "flotilla fabric: traffic from a view keeps its source address (no CNI masquerade)"
	// GuardComment tags the guard's rules.
	GuardComment = "flotilla fabric: traffic to a view leaves the gateway only through the tunnel"
)

// guardHooks are the guard's chains: what the node forwards for pods
// and other nodes, and what the node itself sends.
var guardHooks = [...]struct {
	name, hookName string
	hook           *nftables.ChainHook
}{
	{chainGuardFwd, "forward", nftables.ChainHookForward},
	{chainGuardOut, "output", nftables.ChainHookOutput},
}

func guardChain(t *nftables.Table, i int) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: guardHooks[i].name, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: guardHooks[i].hook, Priority: nftables.ChainPriorityFilter, Policy: &accept}
}

// guardRule is the one rule of a guard chain:
//
//	ip daddr @views oifname != <tunnel> counter drop
func guardRule(t *nftables.Table, ch *nftables.Chain, s *nftables.Set, tunnel string) *nftables.Rule {
	return &nftables.Rule{Table: t, Chain: ch, UserData: userdata.AppendString(nil, userdata.TypeComment, GuardComment),
		Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offsetDaddr, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(tunnel)},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}}
}

// guardDropped reads the packets each guard chain of table name has
// dropped, by the chain's hook ("forward", "output"), in the calling
// thread's network namespace; ok is false where there is no guard's rule
// (a worker node, before the first Apply).
func guardDropped(name string) (dropped map[string]uint64, ok bool, err error) {
	c, err := newNFTConn()
	if err != nil {
		return nil, false, err
	}
	t := exemptTable(name)
	dropped = map[string]uint64{}
	for _, g := range guardHooks {
		rules, err := c.GetRules(t, &nftables.Chain{Name: g.name, Table: t})
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("read the guard's counter in %s/%s: %w", name, g.name, err)
		}
		for _, r := range rules {
			if comment, _ := userdata.GetString(r.UserData, userdata.TypeComment); comment != GuardComment {
				continue
			}
			for _, e := range r.Exprs {
				if ctr, isCounter := e.(*expr.Counter); isCounter {
					dropped[g.hookName] += ctr.Packets
					ok = true
				}
			}
		}
	}
	return dropped, ok, nil
}

// ifname is an interface name as the kernel compares it.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// Offsets of the addresses in the IPv4 header.
const (
	offsetSaddr = 12
	offsetDaddr = 16
)

func exemptTable(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: nftables.TableFamilyIPv4}
}

func exemptChain(t *nftables.Table) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: chainExempt, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(exemptPriority), Policy: &accept}
}

func viewsSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: setViews, Interval: true, KeyType: nftables.TypeIPAddr}
}

// exemptRules are our two rules, in order, by comment:
//
//	ip daddr @views snat ip to ip saddr
//	ip saddr @views snat ip to ip saddr
func exemptRules(t *nftables.Table, ch *nftables.Chain, s *nftables.Set) []*nftables.Rule {
	rule := func(match uint32, comment string) *nftables.Rule {
		return &nftables.Rule{Table: t, Chain: ch, UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
			Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: match, Len: 4},
				&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offsetSaddr, Len: 4},
				&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
			}}
	}
	return []*nftables.Rule{rule(offsetDaddr, commentToView), rule(offsetSaddr, commentFromView)}
}

// kernelExemption is our table as read back.
type kernelExemption struct {
	table  bool
	chains map[string]*nftables.Chain
	rules  []*nftables.Rule            // of chainExempt
	guards map[string][]*nftables.Rule // of the guard chains, by chain
	sets   map[string]*nftables.Set
	ivs    []nftinterval.Interval // of setViews
	stray  []nftables.SetElement
}

func readExemption(c *nftables.Conn, name string) (kernelExemption, error) {
	k := kernelExemption{chains: map[string]*nftables.Chain{}, sets: map[string]*nftables.Set{}, guards: map[string][]*nftables.Rule{}}
	exists, err := tableExists(c, name)
	if err != nil || !exists {
		return k, err
	}
	k.table = true
	t := exemptTable(name)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return k, fmt.Errorf("list nftables chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == name {
			k.chains[ch.Name] = ch
		}
	}
	if ch := k.chains[chainExempt]; ch != nil {
		if k.rules, err = c.GetRules(t, ch); err != nil {
			return k, fmt.Errorf("list rules of %s/%s: %w", name, chainExempt, err)
		}
	}
	for _, g := range guardHooks {
		if ch := k.chains[g.name]; ch != nil {
			if k.guards[g.name], err = c.GetRules(t, ch); err != nil {
				return k, fmt.Errorf("list rules of %s/%s: %w", name, g.name, err)
			}
		}
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return k, fmt.Errorf("list sets of nftables table %s: %w", name, err)
	}
	for _, s := range sets {
		k.sets[s.Name] = s
	}
	if s := k.sets[setViews]; s != nil {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return k, fmt.Errorf("list elements of set %s: %w", setViews, err)
		}
		var ivs []nftinterval.Dumped
		ivs, k.stray = nftinterval.Parse(elems)
		for _, iv := range ivs {
			k.ivs = append(k.ivs, iv.Interval)
		}
	}
	return k, nil
}

// sound reports whether the chain and set, where present, are of the kind
// we make; if not, the table is rebuilt.
func (k kernelExemption) sound() bool {
	if ch := k.chains[chainExempt]; ch != nil {
		if ch.Type != nftables.ChainTypeNAT || ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting ||
			ch.Priority == nil || *ch.Priority != exemptPriority {
			return false
		}
	}
	if s := k.sets[setViews]; s != nil {
		if !s.Interval || s.IsMap || s.KeyType.Name != nftables.TypeIPAddr.Name {
			return false
		}
	}
	for i, g := range guardHooks {
		if ch, want := k.chains[g.name], guardChain(nil, i); ch != nil {
			if ch.Type != want.Type || ch.Hooknum == nil || *ch.Hooknum != *want.Hooknum ||
				ch.Priority == nil || *ch.Priority != *want.Priority {
				return false
			}
		}
	}
	return true
}

// guardRight reports whether the guard chain holds exactly our rule for
// the tunnel interface.
func (k kernelExemption) guardRight(chain, tunnel string) bool {
	rules := k.guards[chain]
	if len(rules) != 1 {
		return false
	}
	if c, _ := userdata.GetString(rules[0].UserData, userdata.TypeComment); c != GuardComment {
		return false
	}
	for _, e := range rules[0].Exprs {
		if cmp, ok := e.(*expr.Cmp); ok && cmp.Op == expr.CmpOpNeq {
			return slices.Equal(cmp.Data, ifname(tunnel))
		}
	}
	return false
}

// rulesRight reports whether the chain holds exactly our two rules.
func (k kernelExemption) rulesRight() bool {
	var have []string
	for _, r := range k.rules {
		c, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		have = append(have, c)
	}
	return slices.Equal(have, []string{commentToView, commentFromView})
}

// reconcileExemption makes our table hold exactly the exemption of views,
// and with tunnel set (the gateway node) the guard that lets traffic to
// them leave only through that link, in one atomic transaction, and
// reports how many objects and elements it changed. The set changes by
// its difference only.
func reconcileExemption(name string, views []netip.Prefix, tunnel string) (int, error) {
	c, err := newNFTConn()
	if err != nil {
		return 0, err
	}
	k, err := readExemption(c, name)
	if err != nil {
		return 0, err
	}
	t := exemptTable(name)
	changes := 0
	if k.table && !k.sound() {
		c.DelTable(t)
		changes++
		k = kernelExemption{}
	}
	if !k.table {
		c.AddTable(t)
		changes++
	}
	s := viewsSet(t)
	if have := k.sets[setViews]; have != nil {
		s = have
	} else {
		if err := c.AddSet(s, nil); err != nil {
			return 0, fmt.Errorf("add set %s: %w", setViews, err)
		}
		changes++
	}
	ch := exemptChain(t)
	if k.chains[chainExempt] == nil {
		c.AddChain(ch)
		changes++
	}
	if !k.rulesRight() {
		if len(k.rules) > 0 {
			c.FlushChain(ch)
		}
		for _, r := range exemptRules(t, ch, s) {
			c.AddRule(r)
			changes++
		}
	}
	wanted := map[string]bool{chainExempt: true}
	if tunnel != "" {
		for i, g := range guardHooks {
			wanted[g.name] = true
			gc := guardChain(t, i)
			if k.chains[g.name] == nil {
				c.AddChain(gc)
				changes++
			}
			if !k.guardRight(g.name, tunnel) {
				if len(k.guards[g.name]) > 0 {
					c.FlushChain(gc)
				}
				c.AddRule(guardRule(t, gc, s, tunnel))
				changes++
			}
		}
	}
	// Anything else in our table is not of our making: it goes.
	for n, other := range k.chains {
		if !wanted[n] {
			c.FlushChain(other)
			c.DelChain(other)
			changes++
		}
	}
	for n, other := range k.sets {
		if n != setViews {
			c.DelSet(other)
			changes++
		}
	}
	want := map[nftinterval.Interval]bool{}
	var add []nftinterval.Interval
	for _, v := range views {
		want[nftinterval.Of(v)] = true
	}
	have := map[nftinterval.Interval]bool{}
	del := k.stray
	for _, iv := range k.ivs {
		have[iv] = true
		if !want[iv] {
			del = append(del, iv.Elements()...)
		}
	}
	for _, v := range views {
		if iv := nftinterval.Of(v); !have[iv] {
			add = append(add, iv)
		}
	}
	changes += len(del) + len(add)
	if err := nftinterval.Change(c, s, del, nftinterval.ElementsOf(add)); err != nil {
		return 0, err
	}
	if changes == 0 {
		return 0, nil
	}
	if err := c.Flush(); err != nil {
		return 0, fmt.Errorf("apply nftables table %s: %w", name, err)
	}
	return changes, nil
}

func removeExemption(name string) error {
	c, err := newNFTConn()
	if err != nil {
		return err
	}
	exists, err := tableExists(c, name)
	if err != nil || !exists {
		return err
	}
	c.DelTable(exemptTable(name))
	if err := c.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete nftables table %s: %w", name, err)
	}
	return nil
}

// newNFTConn returns a connection that opens a fresh netlink socket per
// operation, in the calling thread's network namespace. A new one per
// reconcile: a Conn keeps the first serialisation error forever.
func newNFTConn() (*nftables.Conn, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
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
