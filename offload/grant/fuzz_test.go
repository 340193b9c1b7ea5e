package grant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
)

// FuzzOpen feeds Open what a provider could seal, and what anybody could
// send: it never panics, refuses with a typed error that does not quote
// the token, and whatever it opens is a valid grant that seals again.
func FuzzOpen(f *testing.F) {
	p, c := newID(f), newID(f)
	for _, g := range []Grant{sample(f, p, c, 1), revocation(p, c, 2)} {
		b, err := json.Marshal(wireFields(f, g))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(mustSeal(f, p, c.Public(), g), true)
	}
	f.Add([]byte(`{"version":1,"provider":"x","consumer":"y","serial":1,"ca":"-----BEGIN CERTIFICATE-----\n"}`), false)
	f.Add([]byte{1, 2, 3}, true)
	f.Fuzz(func(t *testing.T, b []byte, asSent bool) {
		sealed := b
		if !asSent {
			// b is the plaintext: the box and signature are genuine, so
			// the decoder and validation are what is under test.
			var err error
			if sealed, err = p.SealFor(c.Public(), Purpose, b); err != nil {
				t.Fatal(err)
			}
		}
		g, err := Open(c, p.Public(), sealed)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNotForUs) && !errors.Is(err, ErrForged) {
				t.Fatalf("Open refused with an untyped error: %s", safe(err))
			}
			if tok := tokenIn(b); len(tok) >= 8 && bytes.Contains([]byte(err.Error()), []byte(tok)) {
				t.Fatalf("Open's error quotes the %d-byte token", len(tok))
			}
			return
		}
		again, err := Seal(p, c.Public(), g)
		if err != nil {
			t.Fatalf("Open accepted a grant Seal refuses: %s", safe(err))
		}
		if g2, err := Open(c, p.Public(), again); err != nil || !g2.Token.Equal(g.Token) || g2.Serial != g.Serial {
			t.Fatalf("a resealed grant does not open the same: %s", safe(err))
		}
	})
}

// tokenIn is the token field of a plaintext, if it has one.
func tokenIn(b []byte) string {
	var w struct {
		Token string `json:"token"`
	}
	json.Unmarshal(b, &w)
	return w.Token
}

// FuzzAccept offers a store holding serial 10 from a provider grants of
// any serial, lifetime and content: the store never goes back to an older
// serial, never holds what does not open, and a refusal changes nothing;
// Check, asked first, answers as Accept does and keeps nothing.
func FuzzAccept(f *testing.F) {
	p, c := newID(f), newID(f)
	held := mustSeal(f, p, c.Public(), sample(f, p, c, 10))
	f.Add(uint64(10), false, int64(3600), []byte(nil))
	f.Add(uint64(11), false, int64(3600), []byte(nil))
	f.Add(uint64(9), false, int64(3600), []byte(nil))
	f.Add(uint64(12), true, int64(0), []byte(nil))
	f.Add(uint64(12), false, int64(-60), []byte(nil))
	f.Add(uint64(0), false, int64(0), []byte(`{"version":1}`))
	now := t0.Add(30 * time.Minute)
	f.Fuzz(func(t *testing.T, serial uint64, revoked bool, lifetime int64, plain []byte) {
		l := &memLedger{m: map[string][]byte{p.ClusterID(): encodeRecord(p.Public(), held)}}
		s := NewStore(c, l)
		var sealed []byte
		var err error
		if plain != nil {
			sealed, err = p.SealFor(c.Public(), Purpose, plain)
		} else {
			g := sample(t, p, c, serial)
			g.ExpiresAt = g.IssuedAt.Add(time.Duration(lifetime) * time.Second)
			if revoked {
				g = revocation(p, c, serial)
			}
			sealed, err = Seal(p, c.Public(), g)
		}
		if err != nil {
			return // Seal refuses it: nothing is sent
		}
		before := l.get(p.ClusterID())
		_, checked, checkErr := s.Check(p.Public(), sealed, now)
		if !bytes.Equal(before, l.get(p.ClusterID())) {
			t.Fatal("Check changed what is held")
		}
		g, change, err := s.Accept(p.Public(), sealed, now)
		after := l.get(p.ClusterID())
		if (checkErr == nil) != (err == nil) || checked != change {
			t.Fatalf("Check said %s, %s; Accept %s, %s", checked, safe(checkErr), change, safe(err))
		}
		if err != nil {
			if !bytes.Equal(before, after) {
				t.Fatalf("a refused grant changed what is held: %s", safe(err))
			}
			return
		}
		h, err := s.held(p.ClusterID())
		if err != nil || !h.ok || h.bad != nil {
			t.Fatalf("after Accept (%s) the store holds nothing that opens: %v %v", change, err, h.bad)
		}
		switch {
		case h.grant.Serial < 10:
			t.Fatalf("Accept went back from serial 10 to %d", h.grant.Serial)
		case change == Unchanged && !bytes.Equal(before, after):
			t.Fatal("Accept said Unchanged and changed what is held")
		case change != Unchanged && !bytes.Equal(h.sealed, sealed):
			t.Fatalf("Accept said %s and holds something else", change)
		case !g.Revoked && !now.Before(g.ExpiresAt):
			t.Fatalf("Accept took an expired grant (%s)", change)
		}
	})
}

// memLedger is an in-memory Ledger, for fuzzing the store's logic without
// a file sync per input; the ipam ledger is tested with its own file.
type memLedger struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (l *memLedger) get(k string) []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.m[k])
}

func (l *memLedger) Grant(p string) ([]byte, error) {
	if v := l.get(p); v != nil {
		return v, nil
	}
	return nil, fmt.Errorf("grant from %s: %w", p, ipam.ErrNotFound)
}

func (l *memLedger) PutGrant(p string, v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[p] = slices.Clone(v)
	return nil
}

func (l *memLedger) DeleteGrant(p string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, p)
	return nil
}

func (l *memLedger) Grants() ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k := range l.m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}
