package grant

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
)

func openLedger(t *testing.T, path string) *ipam.Ledger {
	t.Helper()
	l, err := ipam.Open(path, ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// heldBytes is the record the ledger holds from provider, or nil.
func heldBytes(t *testing.T, l Ledger, provider identity.Identity) []byte {
	t.Helper()
	b, err := l.Grant(provider.ClusterID())
	if errors.Is(err, ipam.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A consumer keeps the newest grant of each provider: what is older, a
// different grant with the serial held, or expired is refused and changes
// nothing; a revocation drops the grant and keeps refusing what came
// before it; all of it survives a restart. Check answers as Accept does,
// without keeping anything.
func TestStoreKeepsTheNewestGrant(t *testing.T) {
	p, c := newID(t), newID(t)
	path := filepath.Join(t.TempDir(), ipam.FileName)
	l := openLedger(t, path)
	s := NewStore(c, l)
	now := t0.Add(time.Minute)
	seal := func(g Grant) []byte { return mustSeal(t, p, c.Public(), g) }
	expired := sample(t, p, c, 4)
	expired.IssuedAt, expired.ExpiresAt = t0.Add(-2*time.Hour), t0.Add(-time.Hour)
	g1, g2, g6 := seal(sample(t, p, c, 1)), seal(sample(t, p, c, 2)), seal(sample(t, p, c, 6))
	steps := []struct {
		name   string
		sealed []byte
		change Change
		err    error
	}{
		{"first grant", g1, Granted, nil},
		{"the same again", g1, Unchanged, nil},
		{"serial 1 sealed anew", seal(sample(t, p, c, 1)), "", ErrReplayed},
		{"newer", g2, Renewed, nil},
		{"older replayed", g1, "", ErrReplayed},
		{"expired", seal(expired), "", ErrExpired},
		{"revoked", seal(revocation(p, c, 5)), Revoked, nil},
		{"revocation again", nil, Unchanged, nil}, // filled below
		{"older replayed after the revocation", g2, "", ErrReplayed},
		{"granted again", g6, Granted, nil},
	}
	steps[7].sealed = steps[6].sealed
	for _, st := range steps {
		before := heldBytes(t, l, p)
		// Check says what Accept is about to do, and keeps nothing.
		_, checked, checkErr := s.Check(p.Public(), st.sealed, now)
		if !bytes.Equal(heldBytes(t, l, p), before) {
			t.Fatalf("%s: Check changed what the ledger holds", st.name)
		}
		g, change, err := s.Accept(p.Public(), st.sealed, now)
		if checked != change || !errors.Is(checkErr, st.err) {
			t.Fatalf("%s: Check = %s, %s; Accept = %s, %s", st.name, checked, safe(checkErr), change, safe(err))
		}
		if st.err != nil {
			if !errors.Is(err, st.err) {
				t.Fatalf("%s: Accept = %s, want %v", st.name, safe(err), st.err)
			}
			if !bytes.Equal(heldBytes(t, l, p), before) {
				t.Fatalf("%s: a refused grant changed what the ledger holds", st.name)
			}
			continue
		}
		if err != nil || change != st.change {
			t.Fatalf("%s: Accept = %s, %s; want %s", st.name, change, safe(err), st.change)
		}
		if g.Provider != p.ClusterID() {
			t.Fatalf("%s: Accept returned a grant from %s", st.name, g.Provider)
		}
	}

	l.Close()
	l = openLedger(t, path)
	s = NewStore(c, l)
	grants, problems, err := s.Load(now)
	if err != nil || len(problems) != 0 || len(grants) != 1 || grants[0].Serial != 6 || !grants[0].Token.Equal(NewToken(secret)) {
		t.Fatalf("Load after restart: %d grants (serial %v), problems %v, %s; want serial 6 with its token", len(grants), serials(grants), problems, safe(err))
	}
	if _, _, err := s.Accept(p.Public(), g2, now); !errors.Is(err, ErrReplayed) {
		t.Fatalf("older grant after restart: %s, want ErrReplayed", safe(err))
	}
	if _, change, err := s.Accept(p.Public(), g6, now); err != nil || change != Unchanged {
		t.Fatalf("held grant after restart: %s, %s; want Unchanged", change, safe(err))
	}
}

func serials(gs []Grant) []uint64 {
	var out []uint64
	for _, g := range gs {
		out = append(out, g.Serial)
	}
	return out
}

// Grants for another cluster, or not from the provider that sent them, are
// refused and stored nowhere.
func TestStoreRefusesForeignGrants(t *testing.T) {
	p, c, other := newID(t), newID(t), newID(t)
	l := openLedger(t, filepath.Join(t.TempDir(), ipam.FileName))
	s := NewStore(c, l)
	forOther := mustSeal(t, p, other.Public(), sample(t, p, other, 1))
	if _, _, err := s.Accept(p.Public(), forOther, t0); !errors.Is(err, ErrNotForUs) {
		t.Errorf("a grant sealed to another cluster: %s, want ErrNotForUs", safe(err))
	}
	fromP := mustSeal(t, p, c.Public(), sample(t, p, c, 1))
	if _, _, err := s.Accept(other.Public(), fromP, t0); !errors.Is(err, ErrForged) {
		t.Errorf("p's grant said to come from another: %s, want ErrForged", safe(err))
	}
	if got, _ := l.Grants(); len(got) != 0 {
		t.Fatalf("refused grants stored: %v", got)
	}
}

// Load reports the grants it cannot hand back, and keeps them: an expired
// grant (whose serial still refuses replays) and a record that no longer
// opens, which the next genuine grant replaces.
func TestLoadReportsWhatItCannotUse(t *testing.T) {
	p, q, c := newID(t), newID(t), newID(t)
	l := openLedger(t, filepath.Join(t.TempDir(), ipam.FileName))
	s := NewStore(c, l)
	if _, _, err := s.Accept(p.Public(), mustSeal(t, p, c.Public(), sample(t, p, c, 3)), t0); err != nil {
		t.Fatal(safe(err))
	}
	if err := l.PutGrant(q.ClusterID(), []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(2 * time.Hour)
	grants, problems, err := s.Load(later)
	if err != nil || len(grants) != 0 || len(problems) != 2 {
		t.Fatalf("Load: %d grants, problems %v, %v; want 2 problems", len(grants), problems, err)
	}
	byProvider := map[string]error{problems[0].Provider: problems[0].Err, problems[1].Provider: problems[1].Err}
	if !errors.Is(byProvider[p.ClusterID()], ErrExpired) || !errors.Is(byProvider[q.ClusterID()], ErrMalformed) {
		t.Fatalf("problems %v; want p's expired and q's malformed", problems)
	}
	if got, _ := l.Grants(); len(got) != 2 {
		t.Fatalf("Load dropped records: %v left", got)
	}
	if _, _, err := s.Accept(p.Public(), mustSeal(t, p, c.Public(), sample(t, p, c, 2)), t0); !errors.Is(err, ErrReplayed) {
		t.Fatalf("an older grant after an expired one: %s, want ErrReplayed", safe(err))
	}
	fresh := sample(t, q, c, 1)
	fresh.IssuedAt, fresh.ExpiresAt = later, later.Add(time.Hour)
	if _, change, err := s.Accept(q.Public(), mustSeal(t, q, c.Public(), fresh), later); err != nil || change != Granted {
		t.Fatalf("a genuine grant over an unreadable record: %s, %s; want Granted", change, safe(err))
	}
	if err := s.Forget(p.ClusterID()); err != nil {
		t.Fatal(err)
	}
	if grants, problems, _ := s.Load(later); len(grants) != 1 || len(problems) != 0 {
		t.Fatalf("after forgetting p and renewing q: %d grants, problems %v", len(grants), problems)
	}
}

// A ledger that fails a write fails Accept: nothing is reported kept
// that is not.
func TestAcceptFailsWhenTheLedgerDoes(t *testing.T) {
	p, c := newID(t), newID(t)
	l := openLedger(t, filepath.Join(t.TempDir(), ipam.FileName))
	s := NewStore(c, failingLedger{l})
	if _, _, err := s.Accept(p.Public(), mustSeal(t, p, c.Public(), sample(t, p, c, 1)), t0); err == nil || !errors.Is(err, errDiskFull) {
		t.Fatalf("Accept with a failing ledger = %s", safe(err))
	}
}

var errDiskFull = errors.New("no space left on device")

type failingLedger struct{ *ipam.Ledger }

func (failingLedger) PutGrant(string, []byte) error { return errDiskFull }
