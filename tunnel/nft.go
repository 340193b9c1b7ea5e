package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/flotilla-io/flotilla/internal/nftinterval"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The NAT lives in an nftables table of our own (family ip), laid out so
// that a peer is added, changed or removed through its own objects only:
//
//	chain egress  { type nat hook postrouting priority srcnat - 10; oifname IF ip daddr vmap @egress-peers }
//	chain ingress { type nat hook prerouting priority dstnat; iifname IF ip saddr vmap @ingress-peers }
//	map egress-peers  { type ipv4_addr : verdict; flags interval; <my view of P> : jump egress-P }
//	map ingress-peers { type ipv4_addr : verdict; flags interval; <my view of P> : jump ingress-P }
//	chain egress-P  { ip saddr <my real> snat ip prefix to <P's view of me> }
//	chain ingress-P { ip daddr <P's view of me> dnat ip prefix to <my real> }
//
//	chain forward { type filter hook forward priority mangle; ... } (forward.go)
//	chain input   { type filter hook input priority mangle; ... }
//	chain beyond  { ... }
//
// The maps key egress by destination and ingress by source in my view of
// the peer, so a new connection costs one map lookup and the rules of one
// peer, whatever the number of peers. SNAT and DNAT need chains of their
// own: the kernel refuses an snat reachable from prerouting.
//
// The egress chain runs before srcnat (100), the priority of iptables'
// nat POSTROUTING and of CNIs' nft masquerade chains: the kernel stops at
// the first NAT chain that binds a source NAT, and at equal priority the
// chain registered last runs first, so a CNI's masquerade would otherwise
// rewrite traffic to a view whenever it was (re)installed after us.
const (
	chainEgress  = "egress"
	chainIngress = "ingress"
	// egressPriority is srcnat - 10: our SNAT binds before any CNI's.
	egressPriority = nftables.ChainPriority(90)
	// dispatchComment tags the one rule of each base chain.
	dispatchComment = "flotilla dispatch by peer"
)

// direction is one half of the NAT: a base chain, the map that picks the
// peer's chain, and the kind of rule in the peers' chains.
type direction struct {
	base string
	vmap string
	kind NATKind
}

var directions = [2]direction{
	{base: chainEgress, vmap: chainEgress + "-peers", kind: SNAT},
	{base: chainIngress, vmap: chainIngress + "-peers", kind: DNAT},
}

// peerChain names a peer's chain: cluster IDs are at most 64 bytes of
// [A-Za-z0-9._-], well inside the kernel's 256 for chain names.
func (d direction) peerChain(peer string) string { return d.base + "-" + peer }

// natTable reconciles the NAT table. It keeps a record of what its last
// transaction made, so that a change to some peers is computed from the
// record and sent as one transaction touching only those peers' objects,
// without reading the table back. The record is trusted while the
// kernel's ruleset generation is the one our last transaction produced,
// or, if anything in nftables changed since, while our chains and maps
// are all still there; anything else (and every repair) reads the table
// back and rebuilds the record.
type natTable struct {
	name   string // nftables table name, family ip
	ifname string // the WireGuard interface the base chains match on
	nft    *nftSession

	applied map[string]PeerNAT // by peer; nil when unknown
	// networks are my networks as the fixed chains last held them
	// (forward.go); a change reads the whole table back.
	networks []netip.Prefix
	gen      uint32   // ruleset generation after our last transaction
	own      []uint32 // generations of our recent transactions, newest last
}

// ownGenerations bounds how many of our generations are remembered; the
// events of a transaction arrive well before this many more transactions.
const ownGenerations = 64

func (n *natTable) table() *nftables.Table {
	return &nftables.Table{Name: n.name, Family: nftables.TableFamilyIPv4}
}

func (n *natTable) baseChain(t *nftables.Table, d direction) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	if d.kind == DNAT {
		return &nftables.Chain{Name: d.base, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}
	}
	return &nftables.Chain{Name: d.base, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(egressPriority), Policy: &accept}
}

func (n *natTable) vmap(t *nftables.Table, d direction) *nftables.Set {
	return &nftables.Set{Table: t, Name: d.vmap, IsMap: true, Interval: true,
		KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

// invalidate forgets the record; the next reconcile reads the table back.
func (n *natTable) invalidate() { n.applied = nil }

// reconcile makes the table hold exactly the NAT of want, in one atomic
// transaction, and reports how many objects it changed. With full set, or
// without a trustworthy record, it reads the table back first.
func (n *natTable) reconcile(want []PeerNAT, networks []netip.Prefix, full bool) (int, error) {
	if !full && n.applied != nil && slices.Equal(networks, n.networks) {
		ok, err := n.recordHolds()
		if err != nil {
			n.nft.fail()
			return 0, err
		}
		if ok {
			changes, err := n.update(want)
			if err == nil {
				return changes, nil
			}
			// The kernel refused a change computed from the record: the
			// record was wrong. Read the table back and try once more.
			n.nft.fail()
		}
	}
	changes, err := n.resync(want, networks)
	if err != nil {
		n.nft.fail()
	}
	return changes, err
}

// recordHolds checks cheaply that the table still is what the record says:
// the generation is ours, or else every chain and map of ours is there.
func (n *natTable) recordHolds() (bool, error) {
	gen, err := n.nft.generation()
	if err != nil {
		return false, err
	}
	if gen == n.gen || n.nft.untouched(n.name, n.gen, gen) {
		n.gen = gen
		return true, nil
	}
	c, err := n.nft.conn()
	if err != nil {
		return false, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, nil
	}
	have := map[string]bool{}
	for _, ch := range chains {
		if ch.Table.Name == n.name {
			have[ch.Name] = true
		}
	}
	if len(have) != len(directions)*(1+len(n.applied))+3 || !have[chainForward] || !have[chainInput] || !have[chainBeyond] {
		return false, nil
	}
	for _, d := range directions {
		if !have[d.base] {
			return false, nil
		}
		for id := range n.applied {
			if !have[d.peerChain(id)] {
				return false, nil
			}
		}
	}
	sets, err := c.GetSets(n.table())
	if err != nil {
		return false, nil
	}
	maps := 0
	for _, s := range sets {
		for _, d := range directions {
			if s.Name == d.vmap {
				maps++
			}
		}
	}
	if maps != len(directions) {
		return false, nil
	}
	n.gen = gen
	return true, nil
}

// update sends the difference between the record and want, touching only
// the objects of peers that were added, changed or removed.
func (n *natTable) update(want []PeerNAT) (int, error) {
	c, err := n.nft.conn()
	if err != nil {
		return 0, err
	}
	t := n.table()
	wanted := make(map[string]PeerNAT, len(want))
	var (
		changes          int
		delElem, addElem [len(directions)][]nftables.SetElement
		delChains        []*nftables.Chain
	)
	for _, p := range want {
		wanted[p.Peer] = p
		old, had := n.applied[p.Peer]
		if had && old.equal(p) {
			continue
		}
		rulesChanged := !had || !slices.Equal(old.Rules, p.Rules)
		viewsChanged := !had || !slices.Equal(old.Views, p.Views)
		for i, d := range directions {
			ch := peerChainObj(t, d.peerChain(p.Peer))
			switch {
			case !had:
				c.AddChain(ch)
				changes++
			case rulesChanged:
				c.FlushChain(ch)
				changes++
			}
			if rulesChanged {
				changes += n.addPeerRules(c, ch, p, d)
			}
			if viewsChanged {
				if had {
					delElem[i] = append(delElem[i], elementsOf(intervals(old.Views, ""), false)...)
				}
				addElem[i] = append(addElem[i], elementsOf(intervals(p.Views, ch.Name), true)...)
				changes += len(p.Views)
			}
		}
	}
	for id, old := range n.applied {
		if _, ok := wanted[id]; ok {
			continue
		}
		for i, d := range directions {
			delElem[i] = append(delElem[i], elementsOf(intervals(old.Views, ""), false)...)
			delChains = append(delChains, peerChainObj(t, d.peerChain(id)))
			changes += 1 + len(old.Views)
		}
	}
	if changes == 0 {
		return 0, nil
	}
	// Order matters within the transaction: a chain must exist before an
	// element jumps to it, and no element may jump to a chain deleted.
	for i, d := range directions {
		if err := nftinterval.Change(c, n.vmap(t, d), delElem[i], addElem[i]); err != nil {
			return 0, err
		}
	}
	for _, ch := range delChains {
		c.DelChain(ch)
	}
	if err := c.Flush(); err != nil {
		n.applied = nil
		return 0, fmt.Errorf("apply nftables table %s: %w", n.name, err)
	}
	n.commit(wanted, true)
	return changes, nil
}

// commit records what the kernel now holds, and, after a transaction of
// ours, its generation. The generation is read after the commit: should
// someone else commit in between, theirs is taken for ours, and a change
// of theirs to our table waits for the periodic resync.
func (n *natTable) commit(applied map[string]PeerNAT, committed bool) {
	gen, err := n.nft.generation()
	if err != nil {
		n.applied = nil // cannot tell our generation from the next one
		return
	}
	if committed {
		n.nft.madeAlone(n.name, n.gen, gen)
	}
	n.applied, n.gen = applied, gen
	if committed {
		n.own = append(n.own, gen)
		if len(n.own) > ownGenerations {
			n.own = n.own[len(n.own)-ownGenerations:]
		}
	}
}

// madeGeneration reports whether generation g was one of our transactions.
func (n *natTable) madeGeneration(g uint32) bool { return slices.Contains(n.own, g) }

// kernelNAT is our table as read back from the kernel.
type kernelNAT struct {
	tableStructure
	maps  map[string][]interval            // by map name
	stray map[string][]nftables.SetElement // end elements without a start, by map name
}

// tableStructure is a table of ours as the kernel holds it, its sets'
// elements apart.
type tableStructure struct {
	table  bool
	chains map[string]*nftables.Chain
	rules  map[string][]ruleRef     // by chain
	sets   map[string]*nftables.Set // by name
}

// readTableStructure reads table t's chains, rules and sets, not their
// elements; a table that does not exist reads as empty.
func readTableStructure(s *nftSession, c *nftables.Conn, t *nftables.Table) (tableStructure, error) {
	k := tableStructure{chains: map[string]*nftables.Chain{}, rules: map[string][]ruleRef{}, sets: map[string]*nftables.Set{}}
	exists, err := tableExists(c, t.Name)
	if err != nil || !exists {
		return k, err
	}
	k.table = true
	chains, err := c.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return k, fmt.Errorf("list nftables chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == t.Name {
			k.chains[ch.Name] = ch
		}
	}
	if k.rules, err = s.rules(t.Name); err != nil {
		return k, err
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return k, fmt.Errorf("list sets of nftables table %s: %w", t.Name, err)
	}
	for _, s := range sets {
		k.sets[s.Name] = s
	}
	return k, nil
}

type ruleRef struct {
	handle  uint64
	comment string
}

// interval is one entry of an interval map, with its verdict: an entry
// jumping to the wrong chain differs from the one wanted.
type interval struct {
	nftinterval.Interval
	v verdict
}

type verdict struct {
	code  int32
	chain string
}

// intervals renders prefixes as intervals jumping to chain.
func intervals(ps []netip.Prefix, chain string) []interval {
	out := make([]interval, 0, len(ps))
	for _, p := range ps {
		out = append(out, interval{nftinterval.Of(p), verdict{code: int32(expr.VerdictJump), chain: chain}})
	}
	return out
}

// elements are the interval's kernel elements; the verdict only if
// withVerdict (a deletion names keys alone).
func (iv interval) elements(withVerdict bool) []nftables.SetElement {
	es := iv.Interval.Elements()
	if withVerdict {
		es[0].VerdictData = &expr.Verdict{Kind: expr.VerdictKind(iv.v.code), Chain: iv.v.chain}
	}
	return es
}

func setOf(ivs []interval) map[interval]bool {
	m := make(map[interval]bool, len(ivs))
	for _, iv := range ivs {
		m[iv] = true
	}
	return m
}

func elementsOf(ivs []interval, withVerdict bool) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(ivs))
	for _, iv := range ivs {
		out = append(out, iv.elements(withVerdict)...)
	}
	return out
}

// parseIntervals reads the elements of an interval map as the kernel
// dumps them back into intervals with their verdicts; end elements with
// no start before them are stray.
func parseIntervals(elems []nftables.SetElement) (ivs []interval, stray []nftables.SetElement) {
	dumped, stray := nftinterval.Parse(elems)
	for _, d := range dumped {
		ivs = append(ivs, interval{d.Interval, parseVerdict(d.StartElement.Val)})
	}
	return ivs, stray
}

func (n *natTable) read(c *nftables.Conn) (kernelNAT, error) {
	st, err := readTableStructure(n.nft, c, n.table())
	k := kernelNAT{tableStructure: st, maps: map[string][]interval{}, stray: map[string][]nftables.SetElement{}}
	if err != nil || !k.table {
		return k, err
	}
	for _, s := range k.sets {
		if !isVerdictMap(s) {
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return k, fmt.Errorf("list elements of map %s: %w", s.Name, err)
		}
		k.maps[s.Name], k.stray[s.Name] = parseIntervals(elems)
	}
	return k, nil
}

// sound reports whether the table's base chains and maps, where present,
// are of the kind we make; if not, the table is rebuilt. A hook's priority
// cannot be changed in place, so a base chain at another priority (an
// older agent's egress at srcnat) is a reason to rebuild.
func (k kernelNAT) sound(n *natTable) bool {
	for _, d := range directions {
		if ch := k.chains[d.base]; ch != nil {
			if !sameHook(ch, n.baseChain(nil, d)) {
				return false
			}
		}
		if s := k.sets[d.vmap]; s != nil {
			if !s.Interval || !isVerdictMap(s) {
				return false
			}
		}
	}
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
	}{{chainForward, nftables.ChainHookForward}, {chainInput, nftables.ChainHookInput}} {
		if ch := k.chains[h.name]; ch != nil && !sameHook(ch, hookChain(nil, h.name, h.hook)) {
			return false
		}
	}
	return true
}

// sameHook reports whether the base chain ch, as read back, has want's
// type, hook and priority.
func sameHook(ch, want *nftables.Chain) bool {
	return ch.Type == want.Type && ch.Hooknum != nil && *ch.Hooknum == *want.Hooknum &&
		ch.Priority != nil && *ch.Priority == *want.Priority
}

// resync reads the table back and changes whatever differs from want, in
// one transaction. Objects in our table that we do not want are removed.
func (n *natTable) resync(want []PeerNAT, networks []netip.Prefix) (int, error) {
	n.applied, n.networks = nil, nil
	c, err := n.nft.conn()
	if err != nil {
		return 0, err
	}
	k, err := n.read(c)
	if err != nil {
		return 0, err
	}
	t := n.table()
	changes := 0
	if k.table && !k.sound(n) {
		c.DelTable(t)
		changes++
		k = kernelNAT{}
	}
	if !k.table {
		c.AddTable(t)
		changes++
	}
	var sets [len(directions)]*nftables.Set
	for i, d := range directions {
		sets[i] = n.vmap(t, d)
		if k.sets[d.vmap] == nil {
			if err := c.AddSet(sets[i], nil); err != nil {
				return 0, fmt.Errorf("add map %s: %w", d.vmap, err)
			}
			changes++
		}
		base := n.baseChain(t, d)
		if k.chains[d.base] == nil {
			c.AddChain(base)
			changes++
		}
		found := false
		for _, r := range k.rules[d.base] {
			if r.comment == dispatchComment && !found {
				found = true
				continue
			}
			if err := c.DelRule(&nftables.Rule{Table: t, Chain: base, Handle: r.handle}); err != nil {
				return 0, fmt.Errorf("delete rule %d of %s/%s: %w", r.handle, n.name, d.base, err)
			}
			changes++
		}
		if !found {
			c.AddRule(&nftables.Rule{Table: t, Chain: base, Exprs: n.dispatchExprs(d, sets[i]),
				UserData: userdata.AppendString(nil, userdata.TypeComment, dispatchComment)})
			changes++
		}
	}

	changes += n.resyncFixed(c, t, k, networks)

	wanted := make(map[string]PeerNAT, len(want))
	wantChains := map[string]bool{chainEgress: true, chainIngress: true, chainForward: true, chainInput: true, chainBeyond: true}
	var wantIvs [len(directions)][]interval
	for _, p := range want {
		wanted[p.Peer] = p
		for i, d := range directions {
			ch := peerChainObj(t, d.peerChain(p.Peer))
			wantChains[ch.Name] = true
			var have []string
			for _, r := range k.rules[ch.Name] {
				have = append(have, r.comment)
			}
			switch {
			case k.chains[ch.Name] == nil:
				c.AddChain(ch)
				changes += 1 + n.addPeerRules(c, ch, p, d)
			case !slices.Equal(have, ruleKeys(p, d.kind)):
				c.FlushChain(ch)
				changes += 1 + n.addPeerRules(c, ch, p, d)
			}
			wantIvs[i] = append(wantIvs[i], intervals(p.Views, ch.Name)...)
		}
	}
	// Chains nobody wants are emptied first (their rules may jump to each
	// other) and deleted last, after the elements that jump to them.
	var stale []*nftables.Chain
	for name, ch := range k.chains {
		if !wantChains[name] {
			c.FlushChain(ch)
			stale = append(stale, ch)
		}
	}
	for i, d := range directions {
		del := k.stray[d.vmap]
		var add []nftables.SetElement
		want, have := setOf(wantIvs[i]), setOf(k.maps[d.vmap])
		for _, iv := range k.maps[d.vmap] {
			if !want[iv] {
				del = append(del, iv.elements(false)...)
				changes++
			}
		}
		for _, iv := range wantIvs[i] {
			if !have[iv] {
				add = append(add, iv.elements(true)...)
				changes++
			}
		}
		changes += len(k.stray[d.vmap])
		if err := nftinterval.Change(c, sets[i], del, add); err != nil {
			return 0, err
		}
	}
	// Sets someone else put into our table go before the stale chains,
	// which their elements may jump to; rules using them are gone by now.
	for name, s := range k.sets {
		if name != directions[0].vmap && name != directions[1].vmap {
			c.DelSet(s)
			changes++
		}
	}
	for _, ch := range stale {
		c.DelChain(ch)
		changes++
	}
	if changes > 0 {
		if err := c.Flush(); err != nil {
			return 0, fmt.Errorf("apply nftables table %s: %w", n.name, err)
		}
	}
	n.commit(wanted, changes > 0)
	n.networks = slices.Clone(networks)
	return changes, nil
}

// isVerdictMap reports whether s maps to verdicts. google/nftables v0.3.0
// reads a verdict map's data type into KeyType, hence both are looked at.
func isVerdictMap(s *nftables.Set) bool {
	return s.IsMap && (s.DataType.Name == nftables.TypeVerdict.Name || s.KeyType.Name == nftables.TypeVerdict.Name)
}

func peerChainObj(t *nftables.Table, name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: t}
}

// addPeerRules appends p's rules of direction d to chain ch and returns
// how many.
func (n *natTable) addPeerRules(c *nftables.Conn, ch *nftables.Chain, p PeerNAT, d direction) int {
	added := 0
	for _, r := range p.Rules {
		if r.Kind != d.kind {
			continue
		}
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: natExprs(r),
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.Key(p.Peer))})
		added++
	}
	return added
}

func ruleKeys(p PeerNAT, kind NATKind) []string {
	var keys []string
	for _, r := range p.Rules {
		if r.Kind == kind {
			keys = append(keys, r.Key(p.Peer))
		}
	}
	return keys
}

// parseVerdict decodes the data of a verdict map element as the kernel
// dumps it: nested NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN.
func parseVerdict(b []byte) verdict {
	var v verdict
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return v
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.code = int32(ad.Uint32())
		case unix.NFTA_VERDICT_CHAIN:
			v.chain = ad.String()
		}
	}
	return v
}

// dispatchExprs renders the base chain's rule:
//
//	oifname IF ip daddr vmap @egress-peers
//	iifname IF ip saddr vmap @ingress-peers
func (n *natTable) dispatchExprs(d direction, s *nftables.Set) []expr.Any {
	iface, offset := expr.MetaKeyOIFNAME, uint32(16)
	if d.kind == DNAT {
		iface, offset = expr.MetaKeyIIFNAME, 12
	}
	return []expr.Any{
		&expr.Meta{Key: iface, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n.ifname)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, DestRegister: 0, SetName: s.Name, SetID: s.ID},
	}
}

// natExprs renders a peer's rule, equivalent to
//
//	ip saddr MATCH snat ip prefix to TO
//	ip daddr MATCH dnat ip prefix to TO
func natExprs(r NATRule) []expr.Any {
	offset, natType := uint32(12), expr.NATTypeSourceNAT
	if r.Kind == DNAT {
		offset, natType = 16, expr.NATTypeDestNAT
	}
	e := matchPrefix(offset, r.Match)
	return append(e,
		&expr.Immediate{Register: 1, Data: r.To.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: lastAddr(r.To).AsSlice()},
		&expr.NAT{Type: natType, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 2, Prefix: true},
	)
}

// remove deletes the whole table; a missing table is not an error.
func (n *natTable) remove() error {
	c, err := n.nft.conn()
	if err != nil {
		return err
	}
	exists, err := tableExists(c, n.name)
	if err != nil {
		n.nft.fail()
		return err
	}
	if !exists {
		return nil
	}
	c.DelTable(n.table())
	if err := c.Flush(); err != nil {
		n.nft.fail()
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete nftables table %s: %w", n.name, err)
		}
	}
	n.applied = nil
	return nil
}

// nftSocketBuffer is the netlink socket buffer size: a transaction for
// 1000 peers gets one acknowledgement per message, more than the default
// buffer holds.
const nftSocketBuffer = 16 << 20

func openNFT(opts ...nftables.ConnOption) (*nftables.Conn, error) {
	opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error {
		if err := c.SetReadBuffer(nftSocketBuffer); err != nil {
			return err
		}
		return c.SetWriteBuffer(nftSocketBuffer)
	}))
	c, err := nftables.New(opts...)
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

// nfgenmsg is the header of every nf_tables message: family, version 0,
// resource ID 0.
func nfgenmsg(family byte) []byte { return []byte{family, unix.NFNETLINK_V0, 0, 0} }

func nftMsgType(msg int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg)
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
