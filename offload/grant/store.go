package grant

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
)

// Ledger is where a Store keeps what it holds (*ipam.Ledger): opaque
// records by provider cluster ID, durable when a write returns. Grant
// returns an error wrapping ipam.ErrNotFound when nothing is held.
type Ledger interface {
	Grant(provider string) ([]byte, error)
	PutGrant(provider string, value []byte) error
	DeleteGrant(provider string) error
	Grants() ([]string, error)
}

// Change says what Accept did.
type Change string

const (
	// Unchanged: the very grant was held already (a resend).
	Unchanged Change = "Unchanged"
	// Granted: a grant from a provider none was held from, or none since
	// its last revocation.
	Granted Change = "Granted"
	// Renewed: a newer grant replaced the one held.
	Renewed Change = "Renewed"
	// Revoked: the provider withdrew its grant; none is held.
	Revoked Change = "Revoked"
)

// Store is a consumer's grants, one per provider, kept sealed in the
// ledger so they survive restarts and the token never lies in the ledger
// in clear. A revocation is kept in place of the grant it withdraws, so
// that an older grant replayed after it is still refused; Forget drops
// both. Its methods are safe for concurrent use.
type Store struct {
	id     identity.Identity
	ledger Ledger
	mu     sync.Mutex // orders Accepts: each compares with what the last wrote
}

// NewStore returns the store of the consumer id.
func NewStore(id identity.Identity, l Ledger) *Store {
	return &Store{id: id, ledger: l}
}

// Accept opens a grant sealed by the provider whose identity key is from
// and keeps it when it is newer than the one held: it refuses a serial
// lower than the one held, or equal with other bytes (ErrReplayed), and an
// expired grant (ErrExpired); the very grant held already is Unchanged. A
// revocation replaces the grant held. What Accept keeps is in the ledger
// when it returns.
func (s *Store) Accept(from ed25519.PublicKey, sealed []byte, now time.Time) (Grant, Change, error) {
	return s.decide(from, sealed, now, func(g Grant) error {
		if err := s.ledger.PutGrant(g.Provider, encodeRecord(from, sealed)); err != nil {
			return fmt.Errorf("accept grant from %s: keep it: %w", g.Provider, err)
		}
		return nil
	})
}

// Check says what Accept would do with a sealed grant, with the same
// refusals, and keeps nothing: a consumer uses it to act on a grant while
// Accept's write to the ledger runs.
func (s *Store) Check(from ed25519.PublicKey, sealed []byte, now time.Time) (Grant, Change, error) {
	return s.decide(from, sealed, now, nil)
}

// decide opens sealed and says what keeping it changes, or why it is
// refused; when it changes something, keep (if not nil) runs with s.mu
// held, and its error refuses the grant.
func (s *Store) decide(from ed25519.PublicKey, sealed []byte, now time.Time, keep func(Grant) error) (Grant, Change, error) {
	g, err := Open(s.id, from, sealed)
	if err != nil {
		return Grant{}, Unchanged, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	change, err := s.change(g, sealed, now)
	switch {
	case err != nil:
		return Grant{}, Unchanged, err
	case change == Unchanged || keep == nil:
		return g, change, nil
	}
	if err := keep(g); err != nil {
		return Grant{}, Unchanged, err
	}
	return g, change, nil
}

// change is what keeping g (opened from sealed) changes, or why it is
// refused. s.mu is held.
func (s *Store) change(g Grant, sealed []byte, now time.Time) (Change, error) {
	h, err := s.held(g.Provider)
	if err != nil {
		return Unchanged, fmt.Errorf("accept grant from %s: %w", g.Provider, err)
	}
	current := h.ok && h.bad == nil
	if current {
		switch {
		case g.Serial < h.grant.Serial:
			return Unchanged, fmt.Errorf("accept grant from %s: %w: serial %d, already hold %d", g.Provider, ErrReplayed, g.Serial, h.grant.Serial)
		case g.Serial == h.grant.Serial && !bytes.Equal(sealed, h.sealed):
			return Unchanged, fmt.Errorf("accept grant from %s: %w: a different grant with serial %d", g.Provider, ErrReplayed, g.Serial)
		}
	}
	if !g.Revoked && !now.Before(g.ExpiresAt) {
		return Unchanged, fmt.Errorf("accept grant from %s: %w at %s (serial %d)", g.Provider, ErrExpired, g.ExpiresAt.UTC().Format(time.RFC3339), g.Serial)
	}
	switch {
	case current && g.Serial == h.grant.Serial:
		return Unchanged, nil
	case g.Revoked:
		return Revoked, nil
	case current && !h.grant.Revoked:
		return Renewed, nil
	}
	return Granted, nil
}

// Problem is a held grant Load could not return.
type Problem struct {
	Provider string
	Err      error
}

// Load returns the grants held, opened again and unexpired, sorted by
// provider, for a consumer starting up. Records that no longer open and
// grants that expired are returned as problems and left in the ledger: a
// newer grant from the provider replaces them. Revocations are neither.
func (s *Store) Load(now time.Time) ([]Grant, []Problem, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	providers, err := s.ledger.Grants()
	if err != nil {
		return nil, nil, fmt.Errorf("load grants: %w", err)
	}
	var grants []Grant
	var problems []Problem
	for _, p := range providers {
		h, err := s.held(p)
		switch {
		case err != nil:
			problems = append(problems, Problem{p, err})
		case h.bad != nil:
			problems = append(problems, Problem{p, h.bad})
		case !h.ok, h.grant.Revoked:
		case !now.Before(h.grant.ExpiresAt):
			problems = append(problems, Problem{p, fmt.Errorf("grant from %s: %w at %s (serial %d)", p, ErrExpired, h.grant.ExpiresAt.UTC().Format(time.RFC3339), h.grant.Serial)})
		default:
			grants = append(grants, h.grant)
		}
	}
	return grants, problems, nil
}

// Forget drops what is held from provider (a member gone for good).
func (s *Store) Forget(provider string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ledger.DeleteGrant(provider); err != nil {
		return fmt.Errorf("forget grant from %s: %w", provider, err)
	}
	return nil
}

// heldGrant is what the ledger holds from one provider.
type heldGrant struct {
	ok     bool // a record is there
	grant  Grant
	sealed []byte
	// bad says why the record does not open; a grant that does replaces it.
	bad error
}

// held reads what is held from provider; only a failing ledger is an error.
func (s *Store) held(provider string) (heldGrant, error) {
	rec, err := s.ledger.Grant(provider)
	if errors.Is(err, ipam.ErrNotFound) {
		return heldGrant{}, nil
	}
	if err != nil {
		return heldGrant{}, err
	}
	h := heldGrant{ok: true}
	key, sealed, err := decodeRecord(rec)
	if err != nil {
		h.bad = fmt.Errorf("grant held from %s: %w", provider, err)
		return h, nil
	}
	if got := identity.ClusterID(key); got != provider {
		h.bad = fmt.Errorf("grant held from %s: %w: kept with the key of %s", provider, ErrMalformed, got)
		return h, nil
	}
	if h.grant, err = Open(s.id, key, sealed); err != nil {
		h.bad = fmt.Errorf("grant held: %w", err)
		return h, nil
	}
	h.sealed = sealed
	return h, nil
}

// A record is the provider's identity key, which opening needs and the
// cluster ID does not give, then the sealed grant:
//
//	0      record format (1)
//	1..32  provider's Ed25519 key
//	33..   sealed grant
const recordFormat = 1

func encodeRecord(key ed25519.PublicKey, sealed []byte) []byte {
	b := make([]byte, 0, 1+len(key)+len(sealed))
	b = append(b, recordFormat)
	b = append(b, key...)
	return append(b, sealed...)
}

func decodeRecord(b []byte) (ed25519.PublicKey, []byte, error) {
	if len(b) < 1+ed25519.PublicKeySize || b[0] != recordFormat {
		return nil, nil, fmt.Errorf("%w: a record of %d bytes, format %d, this agent reads %d", ErrMalformed, len(b), firstByte(b), recordFormat)
	}
	return ed25519.PublicKey(bytes.Clone(b[1 : 1+ed25519.PublicKeySize])), b[1+ed25519.PublicKeySize:], nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}
