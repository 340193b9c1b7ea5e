package ipam

import (
	"fmt"
	"net/netip"

	bolt "go.etcd.io/bbolt"
)

// Batch groups writes to the ledger into one transaction: each takes
// effect in memory when made, and all reach the file in one synced commit
// when Ledger.Batch returns. A caller that makes several writes in a row
// (peering, after a burst of statements) pays one disk sync instead of
// one each. A Batch is valid only inside the call that handed it out.
type Batch interface {
	SyncPeer(peer string, remotes []netip.Prefix) ([]View, error)
	ReleasePeer(peer string) error
	HandOver(from, to string) error
	RecordTheirView(peer string, mine, theirs netip.Prefix) error
	KeepTheirViews(peer string, mine []netip.Prefix) error
	PutPeerStates(states map[string][]byte) error
	Views(peer string) []View
	TheirViews(peer string) []TheirView
}

// Batch runs fn with a Batch and commits what it wrote in one transaction.
// A write that fails inside fn is undone alone, and fn sees its error, as
// from the Ledger's own method; when fn fails, or the commit does, every
// write of the batch is undone and Batch returns the error. The ledger is
// locked meanwhile: fn must not call the Ledger itself.
func (l *Ledger) Batch(fn func(Batch) error) error {
	if l.readOnly {
		return ErrReadOnly
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t := &txn{st: l.st, now: l.now(), l: l, changed: map[string]bool{}}
	undoAll := func() {
		for i := len(t.undo) - 1; i >= 0; i-- {
			t.undo[i]()
		}
	}
	err := t.purgeExpired()
	if err == nil {
		err = fn(&batch{t: t})
	}
	var gen uint64
	if err == nil && len(t.writes) > 0 {
		err = l.db.Update(func(tx *bolt.Tx) error {
			for _, w := range t.writes {
				if err := w(tx); err != nil {
					return err
				}
			}
			var err error
			gen, err = l.bumpGeneration(tx)
			return err
		})
		if err != nil {
			err = fmt.Errorf("commit ledger batch: %w", err)
		}
	}
	if err != nil {
		undoAll()
		return err
	}
	if len(t.changed) > 0 {
		l.index.Store(l.index.Load().with(t.st, t.changed))
	}
	if gen > 0 {
		l.committed(gen)
	}
	return nil
}

type batch struct{ t *txn }

// do runs one write; when it fails, its edits are undone and its file
// writes dropped, so the batch goes on without it.
func (b *batch) do(fn func(t *txn) error) error {
	undo, writes := len(b.t.undo), len(b.t.writes)
	err := fn(b.t)
	if err != nil {
		for i := len(b.t.undo) - 1; i >= undo; i-- {
			b.t.undo[i]()
		}
		b.t.undo, b.t.writes = b.t.undo[:undo], b.t.writes[:writes]
		b.t.occ = nil // it may hold blocks of the undone write
	}
	return err
}

func (b *batch) SyncPeer(peer string, remotes []netip.Prefix) ([]View, error) {
	var out []View
	err := b.do(func(t *txn) error {
		var err error
		out, err = t.syncPeer(peer, remotes)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sync peer %s: %w", peer, err)
	}
	return out, nil
}

func (b *batch) ReleasePeer(peer string) error {
	if err := b.do(func(t *txn) error { return t.releasePeer(peer) }); err != nil {
		return fmt.Errorf("release peer %s: %w", peer, err)
	}
	return nil
}

func (b *batch) HandOver(from, to string) error {
	if err := b.do(func(t *txn) error { return t.handOver(from, to) }); err != nil {
		return fmt.Errorf("hand peer %s's views over to %s: %w", from, to, err)
	}
	return nil
}

func (b *batch) RecordTheirView(peer string, mine, theirs netip.Prefix) error {
	if err := b.do(func(t *txn) error { return t.recordTheirView(peer, mine, theirs) }); err != nil {
		return fmt.Errorf("peer %s sees our %s as %s: %w", peer, mine, theirs, err)
	}
	return nil
}

func (b *batch) KeepTheirViews(peer string, mine []netip.Prefix) error {
	if err := b.do(func(t *txn) error { return t.keepTheirViews(peer, mine) }); err != nil {
		return fmt.Errorf("drop peer %s's views of ranges no longer announced: %w", peer, err)
	}
	return nil
}

func (b *batch) PutPeerStates(states map[string][]byte) error {
	if err := b.do(func(t *txn) error { return t.putPeerStates(states) }); err != nil {
		return fmt.Errorf("put state of %d peers: %w", len(states), err)
	}
	return nil
}

func (b *batch) Views(peer string) []View { return b.t.st.viewsOf(peer) }

func (b *batch) TheirViews(peer string) []TheirView { return b.t.st.theirViewsOf(peer) }
