package tunnel

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flotilla-io/flotilla/internal/nftinterval"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/google/nftables"
)

// kernelFilter is the filter table as read back from the kernel.
type kernelFilter = tableStructure

// readStructure reads the table's chains, rules and sets, not elements.
func (f *filterTable) readStructure(c *nftables.Conn) (kernelFilter, error) {
	return readTableStructure(f.nft, c, f.table())
}

// structured reports whether the table holds exactly the chains, rules and
// sets for the peers of want, of the kinds we make: then only elements can
// differ. Anything else is rebuilt.
func (k kernelFilter) structured(f *filterTable, want map[string]PeerFilter) bool {
	for i, bc := range baseChains {
		base := k.chains[bc.name]
		if base == nil || !sameHook(base, f.baseChain(nil, i)) {
			return false
		}
		if !slices.Equal(comments(k.rules[bc.name]), []string{filterDispatch}) {
			return false
		}
	}
	if vm := k.sets[filterMap]; vm == nil || !vm.Interval || !isVerdictMap(vm) {
		return false
	}
	if len(k.chains) != len(baseChains)+len(want) || len(k.sets) != 1+2*len(want) {
		return false
	}
	for peer := range want {
		if k.chains[fromChain(peer)] == nil ||
			!slices.Equal(comments(k.rules[fromChain(peer)]), filterRuleComments(peer)) {
			return false
		}
		pods, svcs := k.sets[podsSet(peer)], k.sets[servicesSet(peer)]
		if pods == nil || pods.IsMap || pods.Interval || pods.KeyType.Bytes != 4 {
			return false
		}
		if svcs == nil || svcs.IsMap || svcs.Interval || svcs.KeyType.Bytes != serviceKey.Bytes {
			return false
		}
	}
	return true
}

func comments(rs []ruleRef) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.comment)
	}
	return out
}

// resync reads the table back. If its structure is ours for want, only
// the elements that differ change; otherwise the table is replaced, still
// in one transaction, so that no packet sees it half made. Conntrack keeps
// established flows through a replacement.
func (f *filterTable) resync(want []PeerFilter) (int, error) {
	f.applied = nil
	c, err := f.nft.conn()
	if err != nil {
		return 0, err
	}
	k, err := f.readStructure(c)
	if err != nil {
		return 0, err
	}
	wanted := make(map[string]PeerFilter, len(want))
	for _, p := range want {
		wanted[p.Peer] = p
	}
	t := f.table()
	if len(want) == 0 {
		if !k.table {
			f.commit(wanted, false)
			return 0, nil
		}
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			return 0, fmt.Errorf("delete nftables table %s: %w", f.name, err)
		}
		f.commit(wanted, true)
		return 1, nil
	}
	changes := 0
	if k.table && k.structured(f, wanted) {
		changes, err = f.resyncElements(c, t, want)
		if err != nil {
			return 0, err
		}
	} else {
		if k.table {
			c.DelTable(t)
		}
		changes += f.addSkeleton(c, t)
		var addMap []nftables.SetElement
		for _, p := range want {
			n, err := f.addPeer(c, t, p)
			if err != nil {
				return 0, err
			}
			changes += n
			addMap = append(addMap, elementsOf(intervals(p.Views, fromChain(p.Peer)), true)...)
		}
		if err := nftinterval.Change(c, f.vmap(t), nil, addMap); err != nil {
			return 0, err
		}
	}
	if changes > 0 {
		if err := c.Flush(); err != nil {
			return 0, fmt.Errorf("apply nftables table %s: %w", f.name, err)
		}
	}
	f.commit(wanted, changes > 0)
	return changes, nil
}

// resyncElements queues the element changes that bring a table of the
// right structure to want.
func (f *filterTable) resyncElements(c *nftables.Conn, t *nftables.Table, want []PeerFilter) (int, error) {
	changes := 0
	vm := f.vmap(t)
	elems, err := c.GetSetElements(vm)
	if err != nil {
		return 0, fmt.Errorf("list elements of map %s: %w", filterMap, err)
	}
	have, stray := parseIntervals(elems)
	var wantIvs []interval
	for _, p := range want {
		wantIvs = append(wantIvs, intervals(p.Views, fromChain(p.Peer))...)
	}
	del, add := stray, []nftables.SetElement(nil)
	wantSet, haveSet := setOf(wantIvs), setOf(have)
	for _, iv := range have {
		if !wantSet[iv] {
			del = append(del, iv.elements(false)...)
			changes++
		}
	}
	for _, iv := range wantIvs {
		if !haveSet[iv] {
			add = append(add, iv.elements(true)...)
			changes++
		}
	}
	changes += len(stray)
	if err := nftinterval.Change(c, vm, del, add); err != nil {
		return 0, err
	}
	for _, p := range want {
		old, err := readSets(c, t, p.Peer)
		if err != nil {
			return 0, err
		}
		n, err := changeElements(c, t, old, p.sets())
		if err != nil {
			return 0, err
		}
		changes += n
	}
	return changes, nil
}

// readSets reads a peer's two sets back as a decision, sorted. An element
// of another shape (someone else's) is left for deletion by being absent
// from the decision only if it parses; one that does not cannot be in a
// set of our key type.
func readSets(c *nftables.Conn, t *nftables.Table, peer string) (policy.Sets, error) {
	s := policy.Sets{Peer: peer}
	pods, err := c.GetSetElements(podsSetObj(t, peer))
	if err != nil {
		return s, fmt.Errorf("list elements of set %s: %w", podsSet(peer), err)
	}
	for _, e := range pods {
		if a, ok := netip.AddrFromSlice(e.Key); ok && a.Is4() {
			s.Pods = append(s.Pods, a)
		}
	}
	svcs, err := c.GetSetElements(servicesSetObj(t, peer))
	if err != nil {
		return s, fmt.Errorf("list elements of set %s: %w", servicesSet(peer), err)
	}
	for _, e := range svcs {
		if ep, ok := parseServiceKey(e.Key); ok {
			s.Services = append(s.Services, ep)
		}
	}
	slices.SortFunc(s.Pods, netip.Addr.Compare)
	slices.SortFunc(s.Services, policy.CompareEndpoint)
	return s, nil
}

// PolicySets reads the Segregated peers' sets as the kernel holds them
// now, sorted by peer: those an earlier run of the agent made survive its
// restart, and the agent holds them until it has decided anew
// (policyapi.SegregatingDataplane), so that a restart opens nothing it
// had closed. A table or peer chain that is not of our making reads as
// none.
func (t *Tunnel) PolicySets() ([]policy.Sets, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("read the policy sets: tunnel closed")
	}
	out, err := t.filter.readAllSets()
	if err != nil {
		t.nft.fail()
	}
	return out, err
}

// readAllSets reads every Segregated peer's sets, sorted by peer.
func (f *filterTable) readAllSets() ([]policy.Sets, error) {
	c, err := f.nft.conn()
	if err != nil {
		return nil, err
	}
	k, err := f.readStructure(c)
	if err != nil {
		return nil, fmt.Errorf("read nftables table %s: %w", f.name, err)
	}
	var out []policy.Sets
	tab := f.table()
	for name := range k.chains {
		peer, ok := strings.CutPrefix(name, "from-")
		if !ok || !slices.Equal(comments(k.rules[name]), filterRuleComments(peer)) ||
			k.sets[podsSet(peer)] == nil || k.sets[servicesSet(peer)] == nil {
			continue
		}
		s, err := readSets(c, tab, peer)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b policy.Sets) int { return strings.Compare(a.Peer, b.Peer) })
	return out, nil
}
