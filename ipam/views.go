package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ViewRequest asks for the view of one of a peer's ranges.
type ViewRequest struct {
	Peer   string
	Remote netip.Prefix
}

// ViewOf returns how this cluster addresses peer's range remote,
// allocating and recording a view on first use. It is idempotent and the
// answer survives restarts. The view is remote itself when that overlaps
// nothing in use here; otherwise a block of the same size from the pools.
func (l *Ledger) ViewOf(peer string, remote netip.Prefix) (netip.Prefix, error) {
	if err := checkRequest(peer, remote); err != nil {
		return netip.Prefix{}, fmt.Errorf("view of peer %s: %w", peer, err)
	}
	var v View
	var ok bool
	l.read(func(st *state) { v, ok = st.views[peerRange{peer, remote}] })
	if ok {
		return v.View, nil
	}
	err := l.update(func(t *txn) error {
		var err error
		v, err = t.viewOf(peer, remote, false)
		return err
	})
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("view of peer %s range %s: %w", peer, remote, err)
	}
	return v.View, nil
}

// ViewsOf maps many ranges in one transaction: all are recorded or, on the
// first error, none. The views come back in the order of reqs.
func (l *Ledger) ViewsOf(reqs []ViewRequest) ([]View, error) {
	for _, r := range reqs {
		if err := checkRequest(r.Peer, r.Remote); err != nil {
			return nil, fmt.Errorf("view of peer %s: %w", r.Peer, err)
		}
	}
	out := make([]View, 0, len(reqs))
	err := l.update(func(t *txn) error {
		for _, r := range reqs {
			v, err := t.viewOf(r.Peer, r.Remote, false)
			if err != nil {
				return fmt.Errorf("view of peer %s range %s: %w", r.Peer, r.Remote, err)
			}
			out = append(out, v)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SyncPeer makes remotes the complete set of peer's ranges: views of
// ranges no longer listed go to quarantine, new ones are allocated, all
// in one transaction. Use it when a peer's ranges change.
func (l *Ledger) SyncPeer(peer string, remotes []netip.Prefix) (out []View, err error) {
	err = l.Batch(func(b Batch) error {
		out, err = b.SyncPeer(peer, remotes)
		return err
	})
	return out, err
}

func (t *txn) syncPeer(peer string, remotes []netip.Prefix) ([]View, error) {
	for _, r := range remotes {
		if err := checkRequest(peer, r); err != nil {
			return nil, err
		}
	}
	var out []View
	for k := range t.st.views {
		if k.peer == peer && !slices.Contains(remotes, k.r) {
			if err := t.release(k); err != nil {
				return nil, err
			}
		}
	}
	for _, r := range remotes {
		v, err := t.viewOf(peer, r, false)
		if err != nil {
			return nil, fmt.Errorf("range %s: %w", r, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Remap moves an existing view to a fresh block, quarantining the old one.
// The agent calls it for the conflicts SetLocalNetworks reports, then
// tells the peer nothing (views are ours) but rewrites routes and NAT.
func (l *Ledger) Remap(peer string, remote netip.Prefix) (netip.Prefix, error) {
	var v View
	err := l.update(func(t *txn) error {
		k := peerRange{peer, remote}
		if _, ok := t.st.views[k]; !ok {
			return ErrNotFound
		}
		if err := t.release(k); err != nil {
			return err
		}
		var err error
		v, err = t.viewOf(peer, remote, true)
		return err
	})
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("remap peer %s range %s: %w", peer, remote, err)
	}
	return v.View, nil
}

// Release drops the view of one of peer's ranges; its block stays in
// quarantine before anyone else can have it. Releasing an unknown view
// returns ErrNotFound.
func (l *Ledger) Release(peer string, remote netip.Prefix) error {
	err := l.update(func(t *txn) error {
		k := peerRange{peer, remote}
		if _, ok := t.st.views[k]; !ok {
			return ErrNotFound
		}
		return t.release(k)
	})
	if err != nil {
		return fmt.Errorf("release peer %s range %s: %w", peer, remote, err)
	}
	return nil
}

// ReleasePeer forgets a peer on unpeering: all its views go to quarantine
// and its views of us are dropped. Its PeerState is left to its owner.
func (l *Ledger) ReleasePeer(peer string) error {
	return l.Batch(func(b Batch) error { return b.ReleasePeer(peer) })
}

func (t *txn) releasePeer(peer string) error {
	for k := range t.st.views {
		if k.peer == peer {
			if err := t.release(k); err != nil {
				return err
			}
		}
	}
	for k := range t.st.theirs {
		if k.peer == peer {
			if err := t.deleteTheir(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// HandOver releases from's views and gives the blocks to, together with
// those from already had in quarantine: to's views of the same ranges
// then take the same blocks (viewOf, inherit), and so a cluster that came
// back under a new identity is seen here at the addresses it had. The
// blocks keep their quarantine's end; nobody else may have them before.
// The caller decides that to is from's successor (peering: the same
// cluster name at the same endpoint, the old identity no longer alive).
func (l *Ledger) HandOver(from, to string) error {
	return l.Batch(func(b Batch) error { return b.HandOver(from, to) })
}

func (t *txn) handOver(from, to string) error {
	if err := CheckPeer(from); err != nil {
		return err
	}
	if err := CheckPeer(to); err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("%w: a peer cannot succeed itself", ErrInvalidPeer)
	}
	if err := t.releasePeer(from); err != nil {
		return err
	}
	for _, q := range t.st.quarantine {
		if q.Peer == from {
			q.Peer = to
			if err := t.putQuarantine(q); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetLocalNetworks replaces this cluster's own networks. Views that now
// overlap one of them are kept and returned as conflicts: the caller must
// Remap each (they are not moved silently, because routes and NAT follow
// them). New views never overlap a local network. Peers' claims about
// ranges that are no longer ours are dropped.
func (l *Ledger) SetLocalNetworks(nets []LocalNetwork) ([]Conflict, error) {
	seen := map[netip.Prefix]bool{}
	for _, n := range nets {
		if err := CheckRange(n.Range); err != nil {
			return nil, fmt.Errorf("set local networks: %w", err)
		}
		if !n.Kind.valid() {
			return nil, fmt.Errorf("set local networks: %s: unknown kind %q", n.Range, n.Kind)
		}
		if seen[n.Range] {
			return nil, fmt.Errorf("set local networks: %s listed twice", n.Range)
		}
		seen[n.Range] = true
	}
	nets = slices.Clone(nets)
	err := l.update(func(t *txn) error {
		if err := t.setLocals(nets); err != nil {
			return err
		}
		// A peer's claim about how it sees one of our ranges means nothing
		// once the range is no longer ours; the peer learns our new ranges
		// in negotiation and claims again.
		for k := range t.st.theirs {
			if !slices.ContainsFunc(nets, func(n LocalNetwork) bool { return n.Range.Bits() <= k.r.Bits() && overlaps(n.Range, k.r) }) {
				if err := t.deleteTheir(k); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("set local networks: %w", err)
	}
	return l.Conflicts(), nil
}

// Conflicts lists the views that overlap a local network.
func (l *Ledger) Conflicts() []Conflict {
	var out []Conflict
	l.read(func(st *state) {
		for _, v := range st.views {
			for _, n := range st.locals {
				if overlaps(v.View, n.Range) {
					out = append(out, Conflict{View: v, Local: n})
				}
			}
		}
	})
	slices.SortFunc(out, func(a, b Conflict) int {
		if c := strings.Compare(a.View.Peer, b.View.Peer); c != 0 {
			return c
		}
		if c := comparePrefix(a.View.Remote, b.View.Remote); c != 0 {
			return c
		}
		return comparePrefix(a.Local.Range, b.Local.Range)
	})
	return out
}

// LocalNetworks returns this cluster's networks as last set.
func (l *Ledger) LocalNetworks() []LocalNetwork {
	var out []LocalNetwork
	l.read(func(st *state) { out = slices.Clone(st.locals) })
	slices.SortFunc(out, func(a, b LocalNetwork) int { return comparePrefix(a.Range, b.Range) })
	return out
}

// Views returns the views of peer's ranges, or of every peer when peer is "".
func (l *Ledger) Views(peer string) []View {
	var out []View
	l.read(func(st *state) { out = st.viewsOf(peer) })
	return out
}

func (st *state) viewsOf(peer string) []View {
	var out []View
	for k, v := range st.views {
		if peer == "" || k.peer == peer {
			out = append(out, v)
		}
	}
	sortViews(out)
	return out
}

// Quarantine lists released blocks not yet reusable by others.
func (l *Ledger) Quarantine() []Quarantined {
	var out []Quarantined
	now := l.now()
	l.read(func(st *state) {
		for _, q := range st.quarantine {
			if now.Before(q.Until) {
				out = append(out, q)
			}
		}
	})
	slices.SortFunc(out, func(a, b Quarantined) int { return comparePrefix(a.Block, b.Block) })
	return out
}

func checkRequest(peer string, remote netip.Prefix) error {
	if err := CheckPeer(peer); err != nil {
		return err
	}
	return CheckRange(remote)
}

// release moves a view to quarantine.
func (t *txn) release(k peerRange) error {
	v := t.st.views[k]
	if err := t.deleteView(k); err != nil {
		return err
	}
	if t.l.quarantine < 0 {
		return nil
	}
	return t.putQuarantine(Quarantined{Block: v.View, Peer: k.peer, Remote: k.r, Until: t.now.Add(t.l.quarantine)})
}

// viewOf finds or makes the view of (peer, remote). Unless fresh, a block
// this peer released for the same range and still in quarantine is taken
// back, so a flapping peer keeps its addresses.
func (t *txn) viewOf(peer string, remote netip.Prefix, fresh bool) (View, error) {
	k := peerRange{peer, remote}
	if v, ok := t.st.views[k]; ok {
		return v, nil
	}
	for o := range t.st.views {
		if o.peer == peer && overlaps(o.r, remote) {
			return View{}, fmt.Errorf("%w: overlaps the peer's range %s", ErrInvalidRange, o.r)
		}
	}
	occ := t.occupied(remote.Addr().Is4())
	var block netip.Prefix
	if !fresh {
		for b, q := range t.st.quarantine {
			if q.Peer == peer && q.Remote == remote && !t.overlapsLocal(b) {
				block = b
				if err := t.deleteQuarantine(b); err != nil {
					return View{}, err
				}
				break
			}
		}
	}
	if !block.IsValid() && !fresh {
		var err error
		if block, err = t.inherit(peer, remote); err != nil {
			return View{}, err
		}
	}
	if !block.IsValid() && !occ.overlaps(remote) {
		block = remote
	}
	if !block.IsValid() {
		var err error
		if block, err = t.allocate(remote, occ); err != nil {
			return View{}, err
		}
	}
	v := View{Peer: peer, Remote: remote, View: block, Since: t.now}
	return v, t.putView(v)
}

// inherit gives remote the addresses the peer's released views had for
// the ranges it overlaps: a peer that splits or merges its ranges (a
// cluster announcing its nodes' blocks, aggregated anew as nodes come and
// go) keeps every address it still has as it was seen here. The view is
// the quarantined blocks of ranges inside or around remote, at the same
// offset, taken out of quarantine (what of them lies outside remote stays
// there), plus free addresses. Zero when no such view exists.
func (t *txn) inherit(peer string, remote netip.Prefix) (netip.Prefix, error) {
	var mine []Quarantined // the peer's quarantined blocks of ranges overlapping remote
	for _, q := range t.st.quarantine {
		if q.Peer == peer && overlaps(q.Remote, remote) {
			mine = append(mine, q)
		}
	}
	slices.SortFunc(mine, func(a, b Quarantined) int { return comparePrefix(a.Block, b.Block) })
	for _, q := range mine {
		start, ok := shift(remote.Addr(), q.Remote.Addr(), q.Block.Addr())
		if !ok {
			continue
		}
		cand := netip.PrefixFrom(start, remote.Bits())
		if cand.Masked() != cand || t.overlapsLocal(cand) {
			continue
		}
		if t.viewOverlaps(cand) {
			continue
		}
		// Every quarantined block in the way must be this peer's, at the
		// same offset: then each address keeps its meaning.
		var absorb []Quarantined
		consistent := true
		for b, o := range t.st.quarantine {
			if !overlaps(b, cand) {
				continue
			}
			at, ok := shift(o.Remote.Addr(), remote.Addr(), cand.Addr())
			if o.Peer != peer || !ok || at != b.Addr() {
				consistent = false
				break
			}
			absorb = append(absorb, o)
		}
		if !consistent {
			continue
		}
		for _, o := range absorb {
			if err := t.deleteQuarantine(o.Block); err != nil {
				return netip.Prefix{}, err
			}
			// Of a larger block, what lies outside cand stays quarantined.
			for _, rest := range outside(o.Block, cand) {
				r, _ := shift(rest.Addr(), o.Block.Addr(), o.Remote.Addr())
				if err := t.putQuarantine(Quarantined{Block: rest, Peer: peer, Remote: netip.PrefixFrom(r, rest.Bits()), Until: o.Until}); err != nil {
					return netip.Prefix{}, err
				}
			}
		}
		return cand, nil
	}
	return netip.Prefix{}, nil
}

func (t *txn) viewOverlaps(p netip.Prefix) bool {
	for _, v := range t.st.views {
		if overlaps(v.View, p) {
			return true
		}
	}
	return false
}

// outside returns the prefixes that cover what of outer lies outside inner
// (nothing when inner holds outer): the sibling of inner's ancestor at
// each length between them.
func outside(outer, inner netip.Prefix) []netip.Prefix {
	if inner.Bits() <= outer.Bits() {
		return nil
	}
	var out []netip.Prefix
	width := inner.Addr().BitLen()
	for l := outer.Bits() + 1; l <= inner.Bits(); l++ {
		anc, _ := inner.Addr().Prefix(l)
		flip := hostMask(width, l-1).and(hostMask(width, l).not()) // the bit that tells siblings apart
		n := addrNum(anc.Addr())
		n = u128{n.hi ^ flip.hi, n.lo ^ flip.lo}
		out = append(out, netip.PrefixFrom(numAddr(n, width == 32), l))
	}
	return out
}

func (t *txn) overlapsLocal(p netip.Prefix) bool {
	for _, n := range t.st.locals {
		if overlaps(n.Range, p) {
			return true
		}
	}
	return false
}

// spans is the sorted set of ranges of one family in use: local networks,
// views and quarantined blocks.
type spans []span

func (t *txn) occupied(v4 bool) spans {
	if occ, ok := t.occ[v4]; ok {
		return occ
	}
	// Expired quarantine entries were purged when the transaction began.
	out := occupiedIn(t.st, v4, t.now)
	if t.occ == nil {
		t.occ = map[bool]spans{}
	}
	t.occ[v4] = out
	return out
}

func compareSpans(a, b span) int {
	switch {
	case a.first.less(b.first):
		return -1
	case b.first.less(a.first):
		return 1
	}
	return 0
}

// insert adds s keeping the order by first address.
func (s spans) insert(x span) spans {
	i, _ := slices.BinarySearchFunc(s, x, compareSpans)
	return slices.Insert(s, i, x)
}

func (s spans) overlaps(p netip.Prefix) bool {
	ps := spanOf(p)
	for _, o := range s {
		if ps.last.less(o.first) {
			break
		}
		if o.overlaps(ps) {
			return true
		}
	}
	return false
}

// allocate finds the lowest free aligned block of remote's size in the
// first pool of its family that has one.
func (t *txn) allocate(remote netip.Prefix, occ spans) (netip.Prefix, error) {
	width := remote.Addr().BitLen()
	mask := hostMask(width, remote.Bits())
	var tried []string
	largest := false // some pool is as large as remote
	for _, pool := range t.l.pools {
		if pool.Addr().BitLen() != width {
			continue
		}
		tried = append(tried, pool.String())
		largest = largest || pool.Bits() <= remote.Bits()
		if pool.Bits() > remote.Bits() {
			continue
		}
		ps := spanOf(pool)
		cand := ps.first
		found := true
		for _, o := range occ {
			last := cand.or(mask)
			if o.last.less(cand) {
				continue
			}
			if last.less(o.first) {
				break
			}
			// The candidate overlaps o: try the first aligned block past it.
			next, overflow := o.last.add(u128{lo: 1})
			if !overflow {
				next, overflow = next.add(mask)
			}
			if overflow {
				found = false
				break
			}
			cand = next.and(mask.not())
			if ps.last.less(cand) {
				found = false
				break
			}
		}
		if found && !ps.last.less(cand.or(mask)) {
			return netip.PrefixFrom(numAddr(cand, width == 32), remote.Bits()), nil
		}
	}
	if len(tried) == 0 {
		return netip.Prefix{}, fmt.Errorf("%w: no %s pool configured for a /%d", ErrExhausted, family(remote), remote.Bits())
	}
	return netip.Prefix{}, &ExhaustedError{Range: remote, Pools: strings.Join(tried, ", "), Larger: !largest}
}

// ExhaustedError says that no remap pool had room for a view of Range; it
// is ErrExhausted (errors.Is).
type ExhaustedError struct {
	Range netip.Prefix
	// Pools are the pools of its family, as a list for people.
	Pools string
	// Larger: Range is larger than every pool, so it can never be
	// remapped, however empty the pools.
	Larger bool
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("%v: no free /%d in %s (%s)", ErrExhausted, e.Range.Bits(), e.Pools, family(e.Range))
}

func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

// RecordTheirView records that peer addresses this cluster's range mine as
// theirs, as learned in negotiation. The claim is refused, with the reason,
// when theirs differs from mine in family or size, when mine is not one of
// our local networks, or when it overlaps what the peer claims for another
// of our ranges. A new claim for the same range replaces the old one.
func (l *Ledger) RecordTheirView(peer string, mine, theirs netip.Prefix) error {
	// Peering repeats settled claims on every reconcile: an identical one
	// costs a read, not a committed transaction.
	same := false
	l.read(func(st *state) { same = st.hasTheirView(peer, mine, theirs) })
	if same && checkClaim(peer, mine, theirs) == nil {
		return nil
	}
	return l.Batch(func(b Batch) error { return b.RecordTheirView(peer, mine, theirs) })
}

func (st *state) hasTheirView(peer string, mine, theirs netip.Prefix) bool {
	o, ok := st.theirs[peerRange{peer, mine}]
	return ok && o.Theirs == theirs
}

func (t *txn) recordTheirView(peer string, mine, theirs netip.Prefix) error {
	if err := checkClaim(peer, mine, theirs); err != nil || t.st.hasTheirView(peer, mine, theirs) {
		return err
	}
	return t.claim(peer, mine, theirs)
}

func (t *txn) claim(peer string, mine, theirs netip.Prefix) error {
	inside := false
	for _, n := range t.st.locals {
		if n.Range.Bits() <= mine.Bits() && overlaps(n.Range, mine) {
			inside = true
		}
	}
	if !inside {
		return fmt.Errorf("%w: %s is not within any of our local networks", ErrInconsistentClaim, mine)
	}
	for k, o := range t.st.theirs {
		if k.peer != peer || k.r == mine {
			continue
		}
		if overlaps(k.r, mine) {
			return fmt.Errorf("%w: %s overlaps %s, for which the peer already claims %s", ErrInconsistentClaim, mine, k.r, o.Theirs)
		}
		if overlaps(o.Theirs, theirs) {
			return fmt.Errorf("%w: %s overlaps %s, the peer's view of our %s", ErrInconsistentClaim, theirs, o.Theirs, k.r)
		}
	}
	return t.putTheir(TheirView{Peer: peer, Mine: mine, Theirs: theirs, Since: t.now})
}

// KeepTheirViews drops the peer's claims about ranges of ours other than
// mine: the ranges this cluster announces changed, and a claim about one it
// no longer announces describes nothing (and would refuse a claim about a
// new range that overlaps it). Nothing to drop costs a read.
func (l *Ledger) KeepTheirViews(peer string, mine []netip.Prefix) error {
	stale := false
	l.read(func(st *state) { stale = st.staleTheirViews(peer, mine) })
	if !stale {
		return nil
	}
	return l.Batch(func(b Batch) error { return b.KeepTheirViews(peer, mine) })
}

func (st *state) staleTheirViews(peer string, mine []netip.Prefix) bool {
	for k := range st.theirs {
		if k.peer == peer && !slices.Contains(mine, k.r) {
			return true
		}
	}
	return false
}

func (t *txn) keepTheirViews(peer string, mine []netip.Prefix) error {
	for k := range t.st.theirs {
		if k.peer == peer && !slices.Contains(mine, k.r) {
			if err := t.deleteTheir(k); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkClaim(peer string, mine, theirs netip.Prefix) error {
	if err := CheckPeer(peer); err != nil {
		return err
	}
	if err := CheckRange(mine); err != nil {
		return err
	}
	if err := CheckRange(theirs); err != nil {
		return err
	}
	if mine.Addr().Is4() != theirs.Addr().Is4() {
		return fmt.Errorf("%w: %s is %s but %s is %s", ErrInconsistentClaim, mine, family(mine), theirs, family(theirs))
	}
	if mine.Bits() != theirs.Bits() {
		return fmt.Errorf("%w: sizes differ (/%d vs /%d)", ErrInconsistentClaim, mine.Bits(), theirs.Bits())
	}
	return nil
}

// TheirViews returns how peer addresses our networks, or every peer's
// claims when peer is "".
func (l *Ledger) TheirViews(peer string) []TheirView {
	var out []TheirView
	l.read(func(st *state) { out = st.theirViewsOf(peer) })
	return out
}

func (st *state) theirViewsOf(peer string) []TheirView {
	var out []TheirView
	for k, v := range st.theirs {
		if peer == "" || k.peer == peer {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b TheirView) int {
		if c := strings.Compare(a.Peer, b.Peer); c != 0 {
			return c
		}
		return comparePrefix(a.Mine, b.Mine)
	})
	return out
}

// AsSeenBy translates ip, an address of this cluster's own (one of its
// pods, say), into the address peer uses for it, by the claims peer made
// about our ranges (RecordTheirView). ok is false when no claim of peer
// covers ip: peer has no route to it.
func (l *Ledger) AsSeenBy(peer string, ip netip.Addr) (theirs netip.Addr, ok bool) {
	l.read(func(st *state) {
		for k, v := range st.theirs {
			if k.peer == peer && v.Mine.Contains(ip) {
				theirs, ok = translate(ip, v.Theirs), true
				return
			}
		}
	})
	return theirs, ok
}
