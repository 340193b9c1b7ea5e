package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/flotilla-io/flotilla/internal/nftinterval"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// The filter for Segregated peers lives in a second table of ours, next to
// the NAT table and reconciled the same way (a record, deltas in one
// transaction, a read-back to repair):
//
//	table ip <NFTable>-policy {
//	  map from-peers { type ipv4_addr : verdict; flags interval; <my view of P> : jump from-P }
//	  chain forward  { type filter hook forward priority filter; policy accept;
//	                   iifname IF ip saddr vmap @from-peers }
//	  chain input    { type filter hook input priority filter; policy accept;
//	                   iifname IF ip saddr vmap @from-peers }
//	  set pods-P     { type ipv4_addr }
//	  set services-P { type ipv4_addr . inet_proto . inet_service }
//	  chain from-P   { ct state established,related accept
//	                   ip daddr @pods-P accept
//	                   ip daddr . meta l4proto . th dport @services-P accept
//	                   counter drop }
//	}
//
// Filtering happens on forward, and on input for what is addressed to the
// gateway host itself (its HostSource on our link, whatever listens on all
// addresses), after the NAT table's DNAT (prerouting):
// the destination is this cluster's real address, the one policy's sets
// hold. The source is still my view of the peer, which the peer's
// WireGuard allowed IPs guarantee, so a peer cannot pass as another. Only
// Segregated peers have elements in the map: a Full peer's traffic finds
// no entry and goes on as before.
//
// A table of its own, not chains in the NAT table: the NAT table's repair
// removes every object it does not know, and each table's record then
// covers one concern.
const (
	filterChain    = "forward"
	inputChain     = "input"
	filterMap      = "from-peers"
	filterDispatch = "flotilla policy dispatch by peer"
)

// baseChains are the hooks a Segregated peer's traffic is filtered at.
var baseChains = [...]struct {
	name string
	hook *nftables.ChainHook
}{
	{filterChain, nftables.ChainHookForward},
	{inputChain, nftables.ChainHookInput},
}

// PolicyTable names the filter table of a tunnel whose NAT table is nat.
func PolicyTable(nat string) string { return nat + "-policy" }

// PeerFilter is the filter for one Segregated peer: traffic from its views
// reaches only Pods, and Services on their protocol and port.
type PeerFilter struct {
	Peer     string
	Views    []netip.Prefix // my views of the peer's networks, sorted
	Pods     []netip.Addr   // sorted, unique
	Services []policy.Endpoint
}

func (a PeerFilter) sets() policy.Sets {
	return policy.Sets{Peer: a.Peer, Pods: a.Pods, Services: a.Services}
}

// Filters lists the filters the desired state needs: one per Segregated
// peer, in the order of d.Peers.
func Filters(d Desired) []PeerFilter {
	var out []PeerFilter
	for _, p := range d.Peers {
		if p.Segregated == nil {
			continue
		}
		s := p.Segregated.Normal()
		f := PeerFilter{Peer: p.ClusterID, Pods: s.Pods, Services: s.Services}
		for _, v := range p.Views {
			f.Views = append(f.Views, v.As)
		}
		slices.SortFunc(f.Views, comparePrefix)
		out = append(out, f)
	}
	return out
}

func podsSet(peer string) string     { return "pods-" + peer }
func servicesSet(peer string) string { return "services-" + peer }
func fromChain(peer string) string   { return "from-" + peer }

var serviceKey = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)

// filterTable reconciles the filter table like natTable does the NAT.
type filterTable struct {
	name   string
	ifname string
	nft    *nftSession

	applied map[string]PeerFilter // by peer; nil when unknown
	gen     uint32
	own     []uint32
}

func (f *filterTable) table() *nftables.Table {
	return &nftables.Table{Name: f.name, Family: nftables.TableFamilyIPv4}
}

func (f *filterTable) baseChain(t *nftables.Table, i int) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: baseChains[i].name, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: baseChains[i].hook, Priority: nftables.ChainPriorityFilter, Policy: &accept}
}

func (f *filterTable) vmap(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: filterMap, IsMap: true, Interval: true,
		KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

func podsSetObj(t *nftables.Table, peer string) *nftables.Set {
	return &nftables.Set{Table: t, Name: podsSet(peer), KeyType: nftables.TypeIPAddr}
}

func servicesSetObj(t *nftables.Table, peer string) *nftables.Set {
	return &nftables.Set{Table: t, Name: servicesSet(peer), KeyType: serviceKey, Concatenation: true}
}

// Rule comments, one per rule of a peer's chain, in order: `nft list`
// names the peer and the purpose, and the read-back compares by them.
func filterRuleComments(peer string) []string {
	return []string{
		"flotilla peer=" + peer + " policy: replies",
		"flotilla peer=" + peer + " policy: offloaded pods",
		"flotilla peer=" + peer + " policy: services",
		"flotilla peer=" + peer + " policy: drop the rest",
	}
}

// reconcile makes the table hold exactly the filters of want, in one
// transaction, and reports how many objects and elements it changed.
// With no Segregated peer the table goes: Full everywhere is today's
// behaviour, with nothing of ours on the forward path.
func (f *filterTable) reconcile(want []PeerFilter, full bool) (int, error) {
	if !full && f.applied != nil {
		if ok, err := f.recordHolds(); err != nil {
			f.nft.fail()
			return 0, err
		} else if ok {
			if len(want) == 0 && len(f.applied) == 0 {
				return 0, nil
			}
			changes, err := f.update(want)
			if err == nil {
				return changes, nil
			}
			// The kernel refused a change computed from the record; read
			// the table back and try once more.
			f.nft.fail()
		}
	}
	changes, err := f.resync(want)
	if err != nil {
		f.nft.fail()
	}
	return changes, err
}

// recordHolds: our generation, or else every chain and set of the record
// still there.
func (f *filterTable) recordHolds() (bool, error) {
	gen, err := f.nft.generation()
	if err != nil {
		return false, err
	}
	if gen == f.gen || f.nft.untouched(f.name, f.gen, gen) {
		f.gen = gen
		return true, nil
	}
	c, err := f.nft.conn()
	if err != nil {
		return false, err
	}
	k, err := f.readStructure(c)
	if err != nil {
		return false, nil
	}
	if !k.table {
		return len(f.applied) == 0, nil
	}
	if !k.structured(f, f.applied) {
		return false, nil
	}
	f.gen = gen
	return true, nil
}

// update sends the difference between the record and want.
func (f *filterTable) update(want []PeerFilter) (int, error) {
	c, err := f.nft.conn()
	if err != nil {
		return 0, err
	}
	t := f.table()
	wanted := make(map[string]PeerFilter, len(want))
	changes := 0
	if len(f.applied) == 0 && len(want) > 0 {
		// The table was absent: make its skeleton first.
		changes += f.addSkeleton(c, t)
	}
	vm := f.vmap(t)
	var delMap, addMap []nftables.SetElement
	var gone []PeerFilter
	for _, p := range want {
		wanted[p.Peer] = p
		old, had := f.applied[p.Peer]
		if !had {
			n, err := f.addPeer(c, t, p)
			if err != nil {
				return 0, err
			}
			changes += n
			addMap = append(addMap, elementsOf(intervals(p.Views, fromChain(p.Peer)), true)...)
			continue
		}
		if !slices.Equal(old.Views, p.Views) {
			delMap = append(delMap, elementsOf(intervals(old.Views, ""), false)...)
			addMap = append(addMap, elementsOf(intervals(p.Views, fromChain(p.Peer)), true)...)
			changes += len(p.Views) + len(old.Views)
		}
		n, err := changeElements(c, t, old.sets(), p.sets())
		if err != nil {
			return 0, err
		}
		changes += n
	}
	for id, old := range f.applied {
		if _, ok := wanted[id]; !ok {
			gone = append(gone, old)
			delMap = append(delMap, elementsOf(intervals(old.Views, ""), false)...)
		}
	}
	if len(want) == 0 && len(f.applied) > 0 {
		c.DelTable(t)
		changes++
	} else {
		if err := nftinterval.Change(c, vm, delMap, addMap); err != nil {
			return 0, err
		}
		// After the map elements that jump to them.
		for _, old := range gone {
			changes += delPeer(c, t, old.Peer)
		}
	}
	if changes == 0 {
		return 0, nil
	}
	if err := c.Flush(); err != nil {
		f.applied = nil
		return 0, fmt.Errorf("apply nftables table %s: %w", f.name, err)
	}
	f.commit(wanted, true)
	return changes, nil
}

// changeElements queues the element delta between two decisions for one
// peer: the cost is the size of the change, not of the sets.
func changeElements(c *nftables.Conn, t *nftables.Table, old, new policy.Sets) (int, error) {
	ds := policy.Diff([]policy.Sets{old}, []policy.Sets{new})
	if len(ds) == 0 {
		return 0, nil
	}
	d := ds[0]
	if err := nftinterval.Change(c, podsSetObj(t, new.Peer), podElements(d.DelPods), podElements(d.AddPods)); err != nil {
		return 0, err
	}
	if err := nftinterval.Change(c, servicesSetObj(t, new.Peer), serviceElements(d.DelServices), serviceElements(d.AddServices)); err != nil {
		return 0, err
	}
	return d.Changes(), nil
}

func (f *filterTable) addSkeleton(c *nftables.Conn, t *nftables.Table) int {
	c.AddTable(t)
	vm := f.vmap(t)
	c.AddSet(vm, nil) //nolint:errcheck // an interval map without elements cannot fail to encode
	for i := range baseChains {
		base := c.AddChain(f.baseChain(t, i))
		c.AddRule(&nftables.Rule{Table: t, Chain: base, Exprs: f.dispatchExprs(vm),
			UserData: userdata.AppendString(nil, userdata.TypeComment, filterDispatch)})
	}
	return 2 + 2*len(baseChains)
}

// addPeer queues a peer's sets, with their elements, and its chain.
func (f *filterTable) addPeer(c *nftables.Conn, t *nftables.Table, p PeerFilter) (int, error) {
	pods, svcs := podsSetObj(t, p.Peer), servicesSetObj(t, p.Peer)
	if err := c.AddSet(pods, nil); err != nil {
		return 0, fmt.Errorf("add set %s: %w", pods.Name, err)
	}
	if err := c.AddSet(svcs, nil); err != nil {
		return 0, fmt.Errorf("add set %s: %w", svcs.Name, err)
	}
	if err := nftinterval.Change(c, pods, nil, podElements(p.Pods)); err != nil {
		return 0, err
	}
	if err := nftinterval.Change(c, svcs, nil, serviceElements(p.Services)); err != nil {
		return 0, err
	}
	ch := c.AddChain(&nftables.Chain{Name: fromChain(p.Peer), Table: t})
	comments := filterRuleComments(p.Peer)
	for i, e := range peerFilterExprs(pods, svcs) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e,
			UserData: userdata.AppendString(nil, userdata.TypeComment, comments[i])})
	}
	return 3 + len(comments) + len(p.Pods) + len(p.Services), nil
}

// delPeer queues the removal of a peer's chain and sets; the map's
// elements jumping to the chain must be gone first.
func delPeer(c *nftables.Conn, t *nftables.Table, peer string) int {
	ch := &nftables.Chain{Name: fromChain(peer), Table: t}
	c.FlushChain(ch)
	c.DelChain(ch)
	c.DelSet(podsSetObj(t, peer))
	c.DelSet(servicesSetObj(t, peer))
	return 3
}

func (f *filterTable) commit(applied map[string]PeerFilter, committed bool) {
	gen, err := f.nft.generation()
	if err != nil {
		f.applied = nil
		return
	}
	if committed {
		f.nft.madeAlone(f.name, f.gen, gen)
	}
	f.applied, f.gen = applied, gen
	if committed {
		f.own = append(f.own, gen)
		if len(f.own) > ownGenerations {
			f.own = f.own[len(f.own)-ownGenerations:]
		}
	}
}

func (f *filterTable) madeGeneration(g uint32) bool { return slices.Contains(f.own, g) }

// dispatchExprs: iifname IF ip saddr vmap @from-peers.
func (f *filterTable) dispatchExprs(s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(f.ifname)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, DestRegister: 0, SetName: s.Name, SetID: s.ID},
	}
}

// peerFilterExprs renders a peer's four rules, in the order of
// filterRuleComments. The services lookup loads its key into consecutive
// 32-bit registers (1 = reg32 0, then 9 and 10), as nft does for a
// concatenation.
func peerFilterExprs(pods, svcs *nftables.Set) [][]expr.Any {
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	daddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	return [][]expr.Any{
		{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: nativeUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			accept,
		},
		{daddr, &expr.Lookup{SourceRegister: 1, SetName: pods.Name, SetID: pods.ID}, accept},
		{
			daddr,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: svcs.Name, SetID: svcs.ID},
			accept,
		},
		{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}},
	}
}

// nativeUint32: conntrack state is a host-order 32-bit value.
func nativeUint32(v uint32) []byte {
	return binary.NativeEndian.AppendUint32(nil, v)
}

func podElements(as []netip.Addr) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(as))
	for _, a := range as {
		out = append(out, nftables.SetElement{Key: a.AsSlice()})
	}
	return out
}

// serviceKeyOf packs address . protocol . port, each field padded to a
// 32-bit register as the kernel compares concatenations.
func serviceKeyOf(e policy.Endpoint) []byte {
	k := make([]byte, 12)
	a := e.Addr.As4()
	copy(k, a[:])
	k[4] = byte(e.Protocol)
	k[8], k[9] = byte(e.Port>>8), byte(e.Port)
	return k
}

func parseServiceKey(k []byte) (policy.Endpoint, bool) {
	if len(k) != 12 {
		return policy.Endpoint{}, false
	}
	return policy.Endpoint{Addr: netip.AddrFrom4([4]byte(k[:4])), Protocol: policy.Protocol(k[4]),
		Port: uint16(k[8])<<8 | uint16(k[9])}, true
}

func serviceElements(es []policy.Endpoint) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(es))
	for _, e := range es {
		out = append(out, nftables.SetElement{Key: serviceKeyOf(e)})
	}
	return out
}

// remove deletes the whole table; a missing table is not an error.
func (f *filterTable) remove() error {
	c, err := f.nft.conn()
	if err != nil {
		return err
	}
	exists, err := tableExists(c, f.name)
	if err != nil {
		f.nft.fail()
		return err
	}
	if !exists {
		f.applied = map[string]PeerFilter{}
		return nil
	}
	c.DelTable(f.table())
	if err := c.Flush(); err != nil {
		f.nft.fail()
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete nftables table %s: %w", f.name, err)
		}
	}
	f.applied = nil
	return nil
}

// Dropped is what a Segregated peer's drop rule has counted.
type Dropped struct {
	Packets, Bytes uint64
}

// dropped reads the drop counters of every peer's chain.
func (f *filterTable) dropped() (map[string]Dropped, error) {
	c, err := f.nft.conn()
	if err != nil {
		return nil, err
	}
	out := map[string]Dropped{}
	t := f.table()
	for peer := range f.applied {
		rules, err := c.GetRules(t, &nftables.Chain{Name: fromChain(peer), Table: t})
		if err != nil {
			f.nft.fail()
			return nil, fmt.Errorf("read drop counter of peer %s: %w", peer, err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					out[peer] = Dropped{Packets: ctr.Packets, Bytes: ctr.Bytes}
				}
			}
		}
	}
	return out, nil
}

// Dropped reports, per Segregated peer, what its traffic has had dropped
// by the filter since its chain was made.
func (t *Tunnel) Dropped() (map[string]Dropped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("read drop counters: tunnel closed")
	}
	return t.filter.dropped()
}
