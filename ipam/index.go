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
