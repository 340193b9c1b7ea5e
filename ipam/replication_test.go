package ipam

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// filledLedger is a ledger with something in every bucket a snapshot
// carries: keys, local networks, views both ways, a quarantined block,
// a peer's state and a grant.
func filledLedger(t testing.TB) (*Ledger, *clock) {
	t.Helper()
	l, clk := openTest(t, Options{})
	setLocals(t, l, testLocals)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(l.PutKey("identity", []byte("seed-of-cluster-a")))
	must(l.PutKey("wireguard", []byte("wg-private-key")))
	_, err := l.ViewOf("peer-b", pfx("10.0.0.0/16"))
	must(err)
	_, err = l.ViewOf("peer-c", pfx("10.0.0.0/16"))
	must(err)
	must(l.Release("peer-c", pfx("10.0.0.0/16")))
	must(l.RecordTheirView("peer-b", pfx("10.0.0.0/16"), pfx("100.64.0.0/16")))
	must(l.PutPeerState("peer-b", []byte("signed statements")))
	must(l.PutGrant("peer-b", []byte("sealed grant")))
	return l, clk
}

func TestGenerationCountsCommittedWrites(t *testing.T) {
	l, _ := openTest(t, Options{})
	if g := l.Generation(); g != 0 {
		t.Fatalf("fresh ledger at generation %d, want 0", g)
	}
	if err := l.PutKey("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ViewOf("peer-b", pfx("10.1.0.0/16")); err != nil {
		t.Fatal(err)
	}
	// A batch with nothing to write commits nothing.
	if err := l.Batch(func(b Batch) error { b.Views("peer-b"); return nil }); err != nil {
		t.Fatal(err)
	}
	// A failed write commits nothing.
	if err := l.PutGrant("not a peer id!", []byte("x")); err == nil {
		t.Fatal("PutGrant with a bad ID succeeded")
	}
	if err := l.PutPeerStates(map[string][]byte{"peer-b": []byte("s")}); err != nil {
		t.Fatal(err)
	}
	if g := l.Generation(); g != 3 {
		t.Fatalf("generation %d after 3 writes, want 3", g)
	}
	if err := l.MarkReplicated(3); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, Options{})
	if g, r := l.Generation(), l.Replicated(); g != 3 || r != 3 {
		t.Fatalf("reopened at generation %d replicated %d, want 3 and 3 (marking is no write)", g, r)
	}
}

func TestWaitGenerationWakesOnCommit(t *testing.T) {
	l, _ := openTest(t, Options{})
	got := make(chan uint64, 1)
	go func() {
		g, _ := l.WaitGeneration(context.Background(), 0)
		got <- g
	}()
	if err := l.PutKey("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != 1 {
		t.Fatalf("WaitGeneration returned %d, want 1", g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.WaitGeneration(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitGeneration with nothing new and a cancelled context: %v", err)
	}
}

func TestRestoreIntoEmptyLedgerKeepsEverything(t *testing.T) {
	src, clk := filledLedger(t)
	gen, enc, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if gen != src.Generation() {
		t.Fatalf("snapshot at generation %d, ledger at %d", gen, src.Generation())
	}
	s, err := DecodeSnapshot(enc)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := openTest(t, Options{Now: clk.Now})
	if !dst.ShouldRestore(s.Generation) {
		t.Fatal("an empty ledger does not want the snapshot")
	}
	if aside, err := dst.Restore(s, "identity"); err != nil || aside != "" {
		t.Fatalf("Restore: %v, set aside %q", err, aside)
	}
	dst = reopen(t, dst, Options{Now: clk.Now})
	sameLedger(t, src, dst)
	if dst.Generation() != gen || dst.Replicated() != gen || dst.ShouldRestore(gen) {
		t.Fatalf("restored at generation %d replicated %d, want %d", dst.Generation(), dst.Replicated(), gen)
	}
	// The next write goes on from the snapshot's generation.
	if err := dst.PutKey("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if dst.Generation() != gen+1 {
		t.Fatalf("generation %d after a write, want %d", dst.Generation(), gen+1)
	}
}

func sameLedger(t *testing.T, want, got *Ledger) {
	t.Helper()
	for _, k := range []string{"identity", "wireguard"} {
		w, _ := want.Key(k)
		g, err := got.Key(k)
		if err != nil || !bytes.Equal(w, g) {
			t.Errorf("key %s: %q %v, want %q", k, g, err, w)
		}
	}
	if w, g := want.Views(""), got.Views(""); fmt.Sprint(w) != fmt.Sprint(g) {
		t.Errorf("views %v, want %v", g, w)
	}
	if w, g := want.TheirViews(""), got.TheirViews(""); fmt.Sprint(w) != fmt.Sprint(g) {
		t.Errorf("their views %v, want %v", g, w)
	}
	if w, g := want.Quarantine(), got.Quarantine(); fmt.Sprint(w) != fmt.Sprint(g) || len(g) == 0 {
		t.Errorf("quarantine %v, want %v", g, w)
	}
	if w, g := want.LocalNetworks(), got.LocalNetworks(); fmt.Sprint(w) != fmt.Sprint(g) {
		t.Errorf("local networks %v, want %v", g, w)
	}
	if s, err := got.PeerState("peer-b"); err != nil || string(s) != "signed statements" {
		t.Errorf("peer state %q %v", s, err)
	}
	if g, err := got.Grant("peer-b"); err != nil || string(g) != "sealed grant" {
		t.Errorf("grant %q %v", g, err)
	}
	v := want.Views("peer-b")[0]
	if a, ok := got.ToLocal("peer-b", v.Remote.Addr().Next()); !ok || a != v.View.Addr().Next() {
		t.Errorf("ToLocal after restore = %s %v, want %s", a, ok, v.View.Addr().Next())
	}
}

func TestShouldRestore(t *testing.T) {
	for _, c := range []struct {
		name                    string
		gen, replicated, newest uint64
		want                    bool
	}{
		{"no snapshot yet", 5, 0, 0, false},
		{"wiped state directory", 0, 0, 7, true},
		{"behind the snapshot", 3, 3, 7, true},
		{"the snapshot is its own", 7, 7, 7, false},
		{"its own snapshot and writes since", 9, 7, 7, false},
		{"another replica wrote since", 9, 7, 8, true},
		{"ahead but diverged", 12, 5, 8, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := &Ledger{gen: c.gen, replicated: c.replicated}
			if got := l.ShouldRestore(c.newest); got != c.want {
				t.Fatalf("ShouldRestore(%d) at generation %d replicated %d = %v, want %v", c.newest, c.gen, c.replicated, got, c.want)
			}
		})
	}
}

func TestRestoreRefusesAndLosesNothing(t *testing.T) {
	src, _ := filledLedger(t)
	_, enc, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := DecodeSnapshot(enc)
	if err != nil {
		t.Fatal(err)
	}
	// Decodes, but a view entry is not one the ledger can load.
	unloadable, _ := DecodeSnapshot(enc)
	for k := range unloadable.Buckets[string(bucketViews)] {
		unloadable.Buckets[string(bucketViews)][k] = []byte{0xff}
	}
	unloadable.Buckets[string(bucketKeys)]["identity"] = []byte("seed-of-cluster-z")

	for _, c := range []struct {
		name string
		snap *Snapshot
		want error
	}{
		{"another cluster's", foreign, ErrForeignSnapshot},
		{"content the ledger cannot load", unloadable, ErrBadSnapshot},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, clk := openTest(t, Options{})
			setLocals(t, l, testLocals)
			if err := l.PutKey("identity", []byte("seed-of-cluster-z")); err != nil {
				t.Fatal(err)
			}
			if _, err := l.ViewOf("peer-q", pfx("10.9.0.0/16")); err != nil {
				t.Fatal(err)
			}
			// It wrote a snapshot once: it was the cluster's state.
			before, _, _ := l.Snapshot()
			if err := l.MarkReplicated(before); err != nil {
				t.Fatal(err)
			}
			views := l.Views("")
			aside, err := l.Restore(c.snap, "identity")
			if !errors.Is(err, c.want) || aside != "" {
				t.Fatalf("Restore: %v, set aside %q, want %v", err, aside, c.want)
			}
			t.Logf("refused: %v", err)
			l = reopen(t, l, Options{Now: clk.Now})
			if g := l.Generation(); g != before {
				t.Errorf("generation %d after a refused restore, want %d", g, before)
			}
			if got := l.Views(""); fmt.Sprint(got) != fmt.Sprint(views) {
				t.Errorf("views %v after a refused restore, want %v", got, views)
			}
			if id, _ := l.Key("identity"); string(id) != "seed-of-cluster-z" {
				t.Errorf("identity %q after a refused restore", id)
			}
		})
	}
}

// A ledger that never wrote nor restored a snapshot yields to one of
// another identity: it is copied aside first, and the copy opens with
// what it held.
func TestRestoreSetsAsideANeverReplicatedLedger(t *testing.T) {
	src, _ := filledLedger(t)
	gen, enc, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := DecodeSnapshot(enc)
	if err != nil {
		t.Fatal(err)
	}
	l, clk := openTest(t, Options{})
	setLocals(t, l, testLocals)
	if err := l.PutKey("identity", []byte("seed-made-and-never-recorded")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ViewOf("peer-q", pfx("10.9.0.0/16")); err != nil {
		t.Fatal(err)
	}
	aside, err := l.Restore(recorded, "identity")
	if err != nil || aside == "" {
		t.Fatalf("Restore: %v, set aside %q; want the snapshot restored and the ledger set aside", err, aside)
	}
	l = reopen(t, l, Options{Now: clk.Now})
	sameLedger(t, src, l)
	if l.Generation() != gen || l.Replicated() != gen {
		t.Fatalf("restored at generation %d replicated %d, want %d", l.Generation(), l.Replicated(), gen)
	}
	old, err := Open(aside, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("the ledger set aside does not open: %v", err)
	}
	defer old.Close()
	if id, _ := old.Key("identity"); string(id) != "seed-made-and-never-recorded" {
		t.Errorf("identity %q in the ledger set aside", id)
	}
	if got := old.Views("peer-q"); len(got) != 1 {
		t.Errorf("views of peer-q in the ledger set aside: %v", got)
	}
}

func TestDecodeSnapshotRefusesDamage(t *testing.T) {
	src, _ := filledLedger(t)
	_, enc, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(enc)
	flipped[len(flipped)/2] ^= 1
	newer, _ := DecodeSnapshot(enc)
	newer.Schema = schemaVersion + 1
	unknown, _ := DecodeSnapshot(enc)
	unknown.Buckets["other"] = map[string][]byte{"k": nil}
	for name, b := range map[string][]byte{
		"empty":           nil,
		"truncated":       enc[:len(enc)-1],
		"one bit flipped": flipped,
		"a ledger file":   ledgerFile(t, src),
		"newer schema":    newer.Encode(),
		"unknown bucket":  unknown.Encode(),
	} {
		if _, err := DecodeSnapshot(b); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: DecodeSnapshot: %v, want ErrBadSnapshot", name, err)
		}
	}
}

func ledgerFile(t *testing.T, l *Ledger) []byte {
	b, err := os.ReadFile(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecodeSnapshot: what another replica wrote is either refused with
// ErrBadSnapshot or reads back the same once encoded, and restoring it into
// a fresh ledger succeeds or is refused with ErrBadSnapshot. With resum,
// the checksum is made right, so the decoder behind it is reached.
func FuzzDecodeSnapshot(f *testing.F) {
	src, _ := filledLedger(f)
	_, enc, err := src.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(enc, false)
	f.Add(enc, true)
	f.Add((&Snapshot{Schema: schemaVersion, Generation: 1}).Encode(), true)
	f.Fuzz(func(t *testing.T, b []byte, resum bool) {
		if resum && len(b) >= sha256.Size {
			body := b[:len(b)-sha256.Size]
			sum := sha256.Sum256(body)
			b = append(bytes.Clone(body), sum[:]...)
		}
		s, err := DecodeSnapshot(b)
		if err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		again, err := DecodeSnapshot(s.Encode())
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("a decoded snapshot does not read back the same once encoded: %v", err)
		}
		l, err := Open(filepath.Join(t.TempDir(), FileName), Options{noSync: true})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := l.Restore(s, "identity"); err != nil && !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("Restore: undocumented error %v", err)
		}
		if err := checkInvariants(l); err != nil {
			t.Fatal(err)
		}
	})
}
