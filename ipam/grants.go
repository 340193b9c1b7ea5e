package ipam

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The grants bucket holds, by provider cluster ID, the grant a consumer
// last accepted from that provider, still sealed (offload/grant reads and
// writes it; the ledger never sees what it carries).

// Grant returns the grant held from provider, or an error wrapping
// ErrNotFound.
func (l *Ledger) Grant(provider string) ([]byte, error) {
	v, err := l.get(bucketGrants, provider)
	if err != nil {
		return nil, fmt.Errorf("grant from %s: %w", provider, err)
	}
	return v, nil
}

// PutGrant stores the grant held from provider, replacing any previous
// one; it is durable when PutGrant returns.
func (l *Ledger) PutGrant(provider string, value []byte) error {
	if err := CheckPeer(provider); err != nil {
		return fmt.Errorf("put grant: %w", err)
	}
	if len(value) == 0 {
		return fmt.Errorf("put grant from %s: empty value (DeleteGrant drops a grant)", provider)
	}
	if err := l.put(bucketGrants, provider, value); err != nil {
		return fmt.Errorf("put grant from %s: %w", provider, err)
	}
	return nil
}

// DeleteGrant drops the grant held from provider; dropping none is no error.
func (l *Ledger) DeleteGrant(provider string) error {
	if err := CheckPeer(provider); err != nil {
		return fmt.Errorf("delete grant: %w", err)
	}
	if err := l.put(bucketGrants, provider, nil); err != nil {
		return fmt.Errorf("delete grant from %s: %w", provider, err)
	}
	return nil
}

// Grants lists the providers a grant is held from, sorted.
func (l *Ledger) Grants() ([]string, error) {
	var out []string
	err := l.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGrants)
		if b == nil {
			return nil // an added bucket a read-only file predates
		}
		return b.ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list grants: %w", err)
	}
	return out, nil
}
