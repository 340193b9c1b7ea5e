package ipam

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Key returns the secret stored under name (for example "identity",
// "federation-keyring", "wireguard"), or an error wrapping ErrNotFound.
func (l *Ledger) Key(name string) ([]byte, error) {
	v, err := l.get(bucketKeys, name)
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", name, err)
	}
	return v, nil
}

// PutKey stores a secret under name, replacing any previous value.
func (l *Ledger) PutKey(name string, value []byte) error {
	if err := l.put(bucketKeys, name, value); err != nil {
		return fmt.Errorf("put key %q: %w", name, err)
	}
	return nil
}

// LoadOrCreateKey returns the secret under name, first storing what create
// returns if there is none. Lookup, creation and storage are one
// transaction, so concurrent callers all get the same value. create runs
// inside that transaction and must not call the ledger.
func (l *Ledger) LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error) {
	if v, err := l.get(bucketKeys, name); err == nil {
		return v, nil
	}
	var out []byte
	err := l.update(func(t *txn) error {
		b := t.tx.Bucket(bucketKeys)
		if v := b.Get([]byte(name)); v != nil {
			out = bytes.Clone(v)
			return nil
		}
		v, err := create()
		if err != nil {
			return err
		}
		if len(v) == 0 {
			return fmt.Errorf("created an empty value")
		}
		out = bytes.Clone(v)
		return b.Put([]byte(name), out)
	})
	if err != nil {
		return nil, fmt.Errorf("load or create key %q: %w", name, err)
	}
	return out, nil
}

// PeerState returns the opaque state stored for peer (by peering), or an
// error wrapping ErrNotFound.
func (l *Ledger) PeerState(peer string) ([]byte, error) {
	v, err := l.get(bucketPeers, peer)
	if err != nil {
		return nil, fmt.Errorf("state of peer %s: %w", peer, err)
	}
	return v, nil
}

// PeersWithState lists the peers that have state stored, sorted.
func (l *Ledger) PeersWithState() ([]string, error) {
	var out []string
	err := l.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPeers).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list peer states: %w", err)
	}
	return out, nil
}

// PutPeerState stores opaque state for peer; nil deletes it.
func (l *Ledger) PutPeerState(peer string, value []byte) error {
	if err := CheckPeer(peer); err != nil {
		return fmt.Errorf("put state of peer: %w", err)
	}
	if err := l.put(bucketPeers, peer, value); err != nil {
		return fmt.Errorf("put state of peer %s: %w", peer, err)
	}
	return nil
}

// PutPeerStates stores the opaque state of several peers in one
// transaction, one synced write for all of them (peering stores the
// statements of a burst at once); a nil value deletes. Nothing is stored
// when a peer's ID is invalid.
func (l *Ledger) PutPeerStates(states map[string][]byte) error {
	if len(states) == 0 {
		return nil
	}
	return l.Batch(func(b Batch) error { return b.PutPeerStates(states) })
}

func (t *txn) putPeerStates(states map[string][]byte) error {
	for peer := range states {
		if err := CheckPeer(peer); err != nil {
			return err
		}
	}
	for peer, value := range states {
		var err error
		if value == nil {
			err = t.del(bucketPeers, []byte(peer))
		} else {
			err = t.put(bucketPeers, []byte(peer), value)
		}
		if err != nil {
			return fmt.Errorf("peer %s: %w", peer, err)
		}
	}
	return nil
}

func (l *Ledger) get(bucket []byte, name string) ([]byte, error) {
	if name == "" {
		return nil, fmt.Errorf("empty name")
	}
	var out []byte
	err := l.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		if b == nil {
			return nil // an added bucket a read-only file predates
		}
		if v := b.Get([]byte(name)); v != nil {
			out = bytes.Clone(v)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, ErrNotFound
	}
	return out, nil
}

func (l *Ledger) put(bucket []byte, name string, value []byte) error {
	if name == "" {
		return fmt.Errorf("empty name")
	}
	return l.update(func(t *txn) error {
		if value == nil {
			return t.tx.Bucket(bucket).Delete([]byte(name))
		}
		return t.tx.Bucket(bucket).Put([]byte(name), value)
	})
}
