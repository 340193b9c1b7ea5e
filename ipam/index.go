package ipam

import "net/netip"

// index serves address translation without locks or allocations: it is
// built once per committed change and swapped in atomically.
type index struct {
	peers map[string][]mapping
}

type mapping struct {
	remote, view netip.Prefix
}

func buildIndex(st *state) *index {
	ix := &index{peers: make(map[string][]mapping)}
	for k, v := range st.views {
		ix.peers[k.peer] = append(ix.peers[k.peer], mapping{remote: v.Remote, view: v.View})
	}
	return ix
}

// with returns a copy of ix in which the mappings of the changed peers are
// rebuilt from st; the others are shared.
func (ix *index) with(st *state, changed map[string]bool) *index {
	n := &index{peers: make(map[string][]mapping, len(ix.peers)+len(changed))}
	for p, ms := range ix.peers {
		if !changed[p] {
			n.peers[p] = ms
		}
	}
	for k, v := range st.views {
		if changed[k.peer] {
			n.peers[k.peer] = append(n.peers[k.peer], mapping{remote: v.Remote, view: v.View})
		}
	}
	return n
}

// ToLocal translates an address as peer addresses it (one of its own pods,
// say) into the address this cluster uses for it. ok is false when ip is in
// none of peer's mapped ranges.
func (l *Ledger) ToLocal(peer string, ip netip.Addr) (local netip.Addr, ok bool) {
	for _, m := range l.index.Load().peers[peer] {
		if m.remote.Contains(ip) {
			return translate(ip, m.view), true
		}
	}
	return netip.Addr{}, false
}

// ToRemote is the inverse of ToLocal: it translates an address in this
// cluster's view of peer into the address peer itself uses.
func (l *Ledger) ToRemote(peer string, ip netip.Addr) (remote netip.Addr, ok bool) {
	for _, m := range l.index.Load().peers[peer] {
		if m.view.Contains(ip) {
			return translate(ip, m.remote), true
		}
	}
	return netip.Addr{}, false
}
