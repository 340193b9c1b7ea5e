package fabric

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The masquerade exemption: one table of ours (family ip), one interval
// set of the views, one NAT chain at srcnat - 5 with two identity SNAT
// rules (see the package comment for why).
const (
	chainExempt    = "exempt"
	setViews       = "views"
	exemptPriority = 95
	// The rules' comments name their purpose in `nft list` and tell the
	// rules apart when read back.
	commentToView   = "flotilla fabric: traffic to a view keeps its source address (no CNI masquerade)"
	commentFromView = "flotilla fabric: traffic from a view keeps its source address (no CNI masquerade)"
	// elementBatch bounds the set elements per netlink message.
	elementBatch = 512
)

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

// interval is one element of the interval set as the kernel holds it: a
// start and the first address after it, flagged as an end; a range up to
// 255.255.255.255 has no end.
type interval struct {
	start, end [4]byte
	open       bool
}

func intervalOf(p netip.Prefix) interval {
	iv := interval{start: p.Addr().As4()}
	if next := lastAddr(p).Next(); next.IsValid() {
		iv.end = next.As4()
	} else {
		iv.open = true
	}
	return iv
}

// elements go in and out in start, end pairs: the kernel refuses an end
// that lands on the start of an interval already inserted in the same
// transaction, which adjacent views would otherwise produce.
func (iv interval) elements() []nftables.SetElement {
	start := nftables.SetElement{Key: slices.Clone(iv.start[:])}
	if iv.open {
		return []nftables.SetElement{start}
	}
	return []nftables.SetElement{start, {Key: slices.Clone(iv.end[:]), IntervalEnd: true}}
}

func elementsOf(ivs []interval) []nftables.SetElement {
	var out []nftables.SetElement
	for _, iv := range ivs {
		out = append(out, iv.elements()...)
	}
	return out
}

// parseIntervals pairs the elements as the kernel dumps them into
// intervals; end elements with no start before them are stray.
func parseIntervals(elems []nftables.SetElement) (ivs []interval, stray []nftables.SetElement) {
	elems = slices.Clone(elems)
	slices.SortFunc(elems, func(a, b nftables.SetElement) int {
		if c := slices.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		// The end of one interval comes before the start of the next.
		switch {
		case a.IntervalEnd && !b.IntervalEnd:
			return -1
		case !a.IntervalEnd && b.IntervalEnd:
			return 1
		}
		return 0
	})
	var cur *interval
	for _, e := range elems {
		if len(e.Key) != 4 {
			continue
		}
		if e.IntervalEnd {
			if cur == nil {
				stray = append(stray, nftables.SetElement{Key: e.Key, IntervalEnd: true})
				continue
			}
			cur.end = [4]byte(e.Key)
			ivs = append(ivs, *cur)
			cur = nil
			continue
		}
		if cur != nil {
			cur.open = true
			ivs = append(ivs, *cur)
		}
		cur = &interval{start: [4]byte(e.Key)}
	}
	if cur != nil {
		cur.open = true
		ivs = append(ivs, *cur)
	}
	return ivs, stray
}

// kernelExemption is our table as read back.
type kernelExemption struct {
	table  bool
	chains map[string]*nftables.Chain
	rules  []*nftables.Rule // of chainExempt
	sets   map[string]*nftables.Set
	ivs    []interval // of setViews
	stray  []nftables.SetElement
}

func readExemption(c *nftables.Conn, name string) (kernelExemption, error) {
	k := kernelExemption{chains: map[string]*nftables.Chain{}, sets: map[string]*nftables.Set{}}
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
		k.ivs, k.stray = parseIntervals(elems)
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
	return true
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
// in one atomic transaction, and reports how many objects and elements it
// changed. The set changes by its difference only.
func reconcileExemption(name string, views []netip.Prefix) (int, error) {
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
	// Anything else in our table is not of our making: it goes.
	for n, other := range k.chains {
		if n != chainExempt {
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
	want := map[interval]bool{}
	var add []interval
	for _, v := range views {
		want[intervalOf(v)] = true
	}
	have := map[interval]bool{}
	del := k.stray
	for _, iv := range k.ivs {
		have[iv] = true
		if !want[iv] {
			del = append(del, iv.elements()...)
		}
	}
	for _, v := range views {
		if iv := intervalOf(v); !have[iv] {
			add = append(add, iv)
		}
	}
	changes += len(del) + len(add)
	if err := changeElements(c, s, del, elementsOf(add)); err != nil {
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

// changeElements queues the deletion of del and then the addition of add,
// in messages small enough for netlink.
func changeElements(c *nftables.Conn, s *nftables.Set, del, add []nftables.SetElement) error {
	for len(del) > 0 {
		k := min(len(del), elementBatch)
		if err := c.SetDeleteElements(s, del[:k]); err != nil {
			return fmt.Errorf("delete elements of set %s: %w", s.Name, err)
		}
		del = del[k:]
	}
	for len(add) > 0 {
		k := min(len(add), elementBatch)
		if err := c.SetAddElements(s, add[:k]); err != nil {
			return fmt.Errorf("add elements to set %s: %w", s.Name, err)
		}
		add = add[k:]
	}
	return nil
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

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(a)
}
