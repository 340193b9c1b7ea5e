package policy

import "net/netip"

// Delta is the change to one peer's sets between two decisions. Created
// means the peer's sets did not exist before (it became Segregated);
// Deleted means they go (the peer became Full or left). Elements of a set
// that is created or deleted are listed all the same, so that a caller can
// count what it changes.
type Delta struct {
	Peer        string
	Created     bool
	Deleted     bool
	AddPods     []netip.Addr
	DelPods     []netip.Addr
	AddServices []Endpoint
	DelServices []Endpoint
}

// Empty reports whether d changes nothing.
func (d Delta) Empty() bool {
	return !d.Created && !d.Deleted && len(d.AddPods) == 0 && len(d.DelPods) == 0 &&
		len(d.AddServices) == 0 && len(d.DelServices) == 0
}

// Changes counts the elements d adds and removes.
func (d Delta) Changes() int {
	return len(d.AddPods) + len(d.DelPods) + len(d.AddServices) + len(d.DelServices)
}

// Diff computes, per peer, the elements to add and remove to go from old
// to new, both as Decide returns them (sorted by peer, sets sorted). Peers
// whose sets are equal are left out. The cost is linear in the sizes of
// the sets, and the result in the size of the change: one pod more is one
// element, whatever else the peer has.
func Diff(old, new []Sets) []Delta {
	var out []Delta
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new) || (i < len(old) && old[i].Peer < new[j].Peer):
			out = append(out, Delta{Peer: old[i].Peer, Deleted: true, DelPods: old[i].Pods, DelServices: old[i].Services})
			i++
		case i == len(old) || new[j].Peer < old[i].Peer:
			out = append(out, Delta{Peer: new[j].Peer, Created: true, AddPods: new[j].Pods, AddServices: new[j].Services})
			j++
		default:
			d := Delta{Peer: new[j].Peer}
			d.AddPods, d.DelPods = diffSorted(old[i].Pods, new[j].Pods, netip.Addr.Compare)
			d.AddServices, d.DelServices = diffSorted(old[i].Services, new[j].Services, CompareEndpoint)
			if !d.Empty() {
				out = append(out, d)
			}
			i++
			j++
		}
	}
	return out
}

// diffSorted merges two sorted lists without duplicates into what new has
// and old lacks (add) and what old has and new lacks (del).
func diffSorted[T any](old, new []T, compare func(a, b T) int) (add, del []T) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new):
			del = append(del, old[i])
			i++
		case i == len(old):
			add = append(add, new[j])
			j++
		default:
			switch c := compare(old[i], new[j]); {
			case c < 0:
				del = append(del, old[i])
				i++
			case c > 0:
				add = append(add, new[j])
				j++
			default:
				i++
				j++
			}
		}
	}
	return add, del
}
