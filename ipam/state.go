package ipam

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// NetworkKind says what a local network is used for.
type NetworkKind string

// The kinds of local network.
const (
	PodNetwork      NetworkKind = "pods"
	ServiceNetwork  NetworkKind = "services"
	NodeNetwork     NetworkKind = "nodes"
	ExternalNetwork NetworkKind = "external"
	ReservedNetwork NetworkKind = "reserved"
)

func (k NetworkKind) valid() bool {
	switch k {
	case PodNetwork, ServiceNetwork, NodeNetwork, ExternalNetwork, ReservedNetwork:
		return true
	}
	return false
}

// LocalNetwork is a range this cluster uses itself; no view may overlap it.
type LocalNetwork struct {
	Range netip.Prefix
	Kind  NetworkKind
}

// View is how this cluster addresses one of a peer's ranges: traffic to
// View is delivered to the peer's Remote.
type View struct {
	Peer   string
	Remote netip.Prefix // the range as the peer addresses it
	View   netip.Prefix // the range as this cluster addresses it
	Since  time.Time
}

// Remapped reports whether the view differs from the peer's own range.
func (v View) Remapped() bool { return v.View != v.Remote }

// TheirView records that Peer addresses this cluster's range Mine as Theirs.
type TheirView struct {
	Peer   string
	Mine   netip.Prefix
	Theirs netip.Prefix
	Since  time.Time
}

// Quarantined is a released view that nobody else may use before Until.
type Quarantined struct {
	Block  netip.Prefix
	Peer   string       // who had it
	Remote netip.Prefix // which of their ranges it mapped
	Until  time.Time
}

// Conflict is a view that overlaps a local network.
type Conflict struct {
	View  View
	Local LocalNetwork
}

func (c Conflict) String() string {
	return fmt.Sprintf("view %s of peer %s range %s overlaps local %s network %s",
		c.View.View, c.View.Peer, c.View.Remote, c.Local.Kind, c.Local.Range)
}

type peerRange struct {
	peer string
	r    netip.Prefix
}

// state is the whole ledger in memory, edited only by a txn.
type state struct {
	locals     []LocalNetwork
	views      map[peerRange]View
	theirs     map[peerRange]TheirView
	quarantine map[netip.Prefix]Quarantined
}

// CheckPeer reports why id cannot name a peer: it must be 1 to 253
// printable ASCII characters without spaces (cluster IDs are).
func CheckPeer(id string) error {
	if id == "" || len(id) > 253 {
		return fmt.Errorf("%w: %q: want 1 to 253 characters", ErrInvalidPeer, id)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return fmt.Errorf("%w: %q: byte %d is not printable ASCII", ErrInvalidPeer, id, i)
		}
	}
	return nil
}

// Records are stored as:
//   local:      prefix -> kind
//   views:      peer 0x00 remote -> view, since(int64 ns)
//   theirs:     peer 0x00 mine -> theirs, since
//   quarantine: block -> until, len(peer) peer, remote
// where a prefix is netip.Prefix's binary form (address bytes, then length).

func prefixBytes(b []byte, p netip.Prefix) []byte {
	b, _ = p.AppendBinary(b)
	return b
}

// readPrefix decodes one prefix from the front of b and returns the rest.
func readPrefix(b []byte) (netip.Prefix, []byte, error) {
	if len(b) < 1 {
		return netip.Prefix{}, nil, fmt.Errorf("prefix: empty")
	}
	var n int
	switch b[0] {
	case 4:
		n = 1 + 4 + 1
	case 6:
		n = 1 + 16 + 1
	default:
		return netip.Prefix{}, nil, fmt.Errorf("prefix: family tag %d", b[0])
	}
	if len(b) < n {
		return netip.Prefix{}, nil, fmt.Errorf("prefix: %d bytes, want %d", len(b), n)
	}
	var p netip.Prefix
	if err := p.UnmarshalBinary(b[1:n]); err != nil {
		return netip.Prefix{}, nil, fmt.Errorf("prefix: %w", err)
	}
	if err := CheckRange(p); err != nil {
		return netip.Prefix{}, nil, err
	}
	return p, b[n:], nil
}

// encPrefix writes a family tag so that records decode without guessing.
func encPrefix(b []byte, p netip.Prefix) []byte {
	if p.Addr().Is4() {
		b = append(b, 4)
	} else {
		b = append(b, 6)
	}
	return prefixBytes(b, p)
}

func peerRangeKey(peer string, r netip.Prefix) []byte {
	b := append([]byte(peer), 0)
	return encPrefix(b, r)
}

func readPeerRangeKey(k []byte) (peerRange, error) {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return peerRange{}, fmt.Errorf("key without separator")
	}
	peer := string(k[:i])
	if err := CheckPeer(peer); err != nil {
		return peerRange{}, err
	}
	r, rest, err := readPrefix(k[i+1:])
	if err != nil {
		return peerRange{}, err
	}
	if len(rest) != 0 {
		return peerRange{}, fmt.Errorf("%d trailing bytes", len(rest))
	}
	return peerRange{peer, r}, nil
}

func readTime(b []byte) (time.Time, []byte, error) {
	if len(b) < 8 {
		return time.Time{}, nil, fmt.Errorf("time: %d bytes, want 8", len(b))
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b))), b[8:], nil
}

func encTime(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixNano()))
}

func encQuarantine(q Quarantined) []byte {
	b := encTime(nil, q.Until)
	b = append(b, byte(len(q.Peer)))
	b = append(b, q.Peer...)
	return encPrefix(b, q.Remote)
}

// loadState reads and checks every record; the first bad one makes the
// file unreadable rather than silently half-loaded.
func loadState(tx *bolt.Tx) (*state, error) {
	st := &state{
		views:      map[peerRange]View{},
		theirs:     map[peerRange]TheirView{},
		quarantine: map[netip.Prefix]Quarantined{},
	}
	bad := func(bucket []byte, k []byte, err error) error {
		return fmt.Errorf("%w: bucket %s, key %x: %v", ErrCorrupt, bucket, k, err)
	}
	for _, name := range allBuckets {
		if tx.Bucket(name) == nil && !slices.ContainsFunc(addedBuckets, func(b []byte) bool { return bytes.Equal(b, name) }) {
			return nil, fmt.Errorf("%w: bucket %s missing", ErrCorrupt, name)
		}
	}
	err := tx.Bucket(bucketLocal).ForEach(func(k, v []byte) error {
		p, rest, err := readPrefix(k)
		if err == nil && len(rest) != 0 {
			err = fmt.Errorf("%d trailing bytes", len(rest))
		}
		if err == nil && !NetworkKind(v).valid() {
			err = fmt.Errorf("unknown network kind %q", v)
		}
		if err != nil {
			return bad(bucketLocal, k, err)
		}
		st.locals = append(st.locals, LocalNetwork{Range: p, Kind: NetworkKind(v)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, b := range []struct {
		name []byte
		put  func(k peerRange, p netip.Prefix, since time.Time)
	}{
		{bucketViews, func(k peerRange, p netip.Prefix, since time.Time) {
			st.views[k] = View{Peer: k.peer, Remote: k.r, View: p, Since: since}
		}},
		{bucketTheirs, func(k peerRange, p netip.Prefix, since time.Time) {
			st.theirs[k] = TheirView{Peer: k.peer, Mine: k.r, Theirs: p, Since: since}
		}},
	} {
		err := tx.Bucket(b.name).ForEach(func(k, v []byte) error {
			key, err := readPeerRangeKey(k)
			if err != nil {
				return bad(b.name, k, err)
			}
			p, rest, err := readPrefix(v)
			if err != nil {
				return bad(b.name, k, err)
			}
			since, rest, err := readTime(rest)
			if err == nil && len(rest) != 0 {
				err = fmt.Errorf("%d trailing bytes", len(rest))
			}
			if err == nil && (p.Bits() != key.r.Bits() || p.Addr().Is4() != key.r.Addr().Is4()) {
				err = fmt.Errorf("%s recorded for %s: sizes differ", p, key.r)
			}
			if err != nil {
				return bad(b.name, k, err)
			}
			b.put(key, p, since)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	err = tx.Bucket(bucketQuarantine).ForEach(func(k, v []byte) error {
		block, rest, err := readPrefix(k)
		if err == nil && len(rest) != 0 {
			err = fmt.Errorf("%d trailing bytes", len(rest))
		}
		if err != nil {
			return bad(bucketQuarantine, k, err)
		}
		until, rest, err := readTime(v)
		if err != nil {
			return bad(bucketQuarantine, k, err)
		}
		if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
			return bad(bucketQuarantine, k, fmt.Errorf("truncated peer"))
		}
		peer := string(rest[1 : 1+rest[0]])
		remote, rest, err := readPrefix(rest[1+rest[0]:])
		if err == nil && len(rest) != 0 {
			err = fmt.Errorf("%d trailing bytes", len(rest))
		}
		if err == nil {
			err = CheckPeer(peer)
		}
		if err != nil {
			return bad(bucketQuarantine, k, err)
		}
		st.quarantine[block] = Quarantined{Block: block, Peer: peer, Remote: remote, Until: until}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// txn is one write: the bbolt transaction, the state it edits, and how to
// undo those edits if the transaction fails.
type txn struct {
	l       *Ledger
	tx      *bolt.Tx
	st      *state
	now     time.Time
	undo    []func()
	changed map[string]bool // peers whose views changed
	occ     map[bool]spans  // occupied ranges by family (true: IPv4), built on first use
	// writes are the file's edits, kept for the commit when tx is nil (a
	// Batch: its transaction opens at the end, once).
	writes []func(tx *bolt.Tx) error
}

// put and del edit the file: in the transaction at once, or in a Batch's
// at its end.
func (t *txn) put(bucket, k, v []byte) error {
	if t.tx != nil {
		return t.tx.Bucket(bucket).Put(k, v)
	}
	t.writes = append(t.writes, func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(k, v) })
	return nil
}

func (t *txn) del(bucket, k []byte) error {
	if t.tx != nil {
		return t.tx.Bucket(bucket).Delete(k)
	}
	t.writes = append(t.writes, func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete(k) })
	return nil
}

func (t *txn) putView(v View) error {
	k := peerRange{v.Peer, v.Remote}
	old, had := t.st.views[k]
	t.undo = append(t.undo, func() {
		if had {
			t.st.views[k] = old
		} else {
			delete(t.st.views, k)
		}
	})
	t.st.views[k] = v
	t.changed[v.Peer] = true
	if occ, ok := t.occ[v.View.Addr().Is4()]; ok {
		t.occ[v.View.Addr().Is4()] = occ.insert(spanOf(v.View))
	}
	val := encTime(encPrefix(nil, v.View), v.Since)
	return t.put(bucketViews, peerRangeKey(v.Peer, v.Remote), val)
}

// deleteView removes a view. Its block stays in the occupied cache, which
// only errs on the safe side within one transaction.
func (t *txn) deleteView(k peerRange) error {
	old, had := t.st.views[k]
	if !had {
		return nil
	}
	t.undo = append(t.undo, func() { t.st.views[k] = old })
	delete(t.st.views, k)
	t.changed[k.peer] = true
	return t.del(bucketViews, peerRangeKey(k.peer, k.r))
}

func (t *txn) putTheir(v TheirView) error {
	k := peerRange{v.Peer, v.Mine}
	old, had := t.st.theirs[k]
	t.undo = append(t.undo, func() {
		if had {
			t.st.theirs[k] = old
		} else {
			delete(t.st.theirs, k)
		}
	})
	t.st.theirs[k] = v
	val := encTime(encPrefix(nil, v.Theirs), v.Since)
	return t.put(bucketTheirs, peerRangeKey(v.Peer, v.Mine), val)
}

func (t *txn) deleteTheir(k peerRange) error {
	old, had := t.st.theirs[k]
	if !had {
		return nil
	}
	t.undo = append(t.undo, func() { t.st.theirs[k] = old })
	delete(t.st.theirs, k)
	return t.del(bucketTheirs, peerRangeKey(k.peer, k.r))
}

func (t *txn) putQuarantine(q Quarantined) error {
	old, had := t.st.quarantine[q.Block]
	t.undo = append(t.undo, func() {
		if had {
			t.st.quarantine[q.Block] = old
		} else {
			delete(t.st.quarantine, q.Block)
		}
	})
	t.st.quarantine[q.Block] = q
	if occ, ok := t.occ[q.Block.Addr().Is4()]; ok {
		t.occ[q.Block.Addr().Is4()] = occ.insert(spanOf(q.Block))
	}
	return t.put(bucketQuarantine, encPrefix(nil, q.Block), encQuarantine(q))
}

func (t *txn) deleteQuarantine(block netip.Prefix) error {
	old, had := t.st.quarantine[block]
	if !had {
		return nil
	}
	t.undo = append(t.undo, func() { t.st.quarantine[block] = old })
	delete(t.st.quarantine, block)
	return t.del(bucketQuarantine, encPrefix(nil, block))
}

func (t *txn) purgeExpired() error {
	for block, q := range t.st.quarantine {
		if !t.now.Before(q.Until) {
			if err := t.deleteQuarantine(block); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *txn) setLocals(nets []LocalNetwork) error {
	b := t.tx.Bucket(bucketLocal)
	for _, n := range t.st.locals {
		if err := b.Delete(encPrefix(nil, n.Range)); err != nil {
			return err
		}
	}
	for _, n := range nets {
		if err := b.Put(encPrefix(nil, n.Range), []byte(n.Kind)); err != nil {
			return err
		}
	}
	old := t.st.locals
	t.undo = append(t.undo, func() { t.st.locals = old })
	t.st.locals = nets
	t.occ = nil
	return nil
}

// sortViews orders views by peer, then family and address of the remote range.
func sortViews(vs []View) {
	slices.SortFunc(vs, func(a, b View) int {
		if c := strings.Compare(a.Peer, b.Peer); c != 0 {
			return c
		}
		return comparePrefix(a.Remote, b.Remote)
	})
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
