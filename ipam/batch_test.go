package ipam

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

// Writes made in a batch are seen by the batch as they are made, by the
// ledger's readers and its address translation once it returns, and
// survive a reopen.
func TestBatchCommitsEveryWrite(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	err := l.Batch(func(b Batch) error {
		for _, peer := range []string{"a", "b"} {
			if _, err := b.SyncPeer(peer, []netip.Prefix{pfx("10.0.0.0/16")}); err != nil {
				return err
			}
			if err := b.RecordTheirView(peer, pfx("10.0.0.0/16"), pfx("100.99.0.0/16")); err != nil {
				return err
			}
		}
		if got := b.Views(""); len(got) != 2 {
			t.Errorf("the batch sees %d views of its own, want 2", len(got))
		}
		if got := b.TheirViews("b"); len(got) != 1 {
			t.Errorf("the batch sees %d claims of b, want 1", len(got))
		}
		return b.PutPeerStates(map[string][]byte{"a": []byte("statement a"), "b": []byte("statement b")})
	})
	if err != nil {
		t.Fatal(err)
	}
	va := l.Views("a")
	if len(va) != 1 || len(l.Views("b")) != 1 || va[0].View == l.Views("b")[0].View {
		t.Fatalf("views a %v, b %v: want one each, distinct", va, l.Views("b"))
	}
	local, ok := l.ToLocal("a", netip.MustParseAddr("10.0.1.2"))
	if !ok || !va[0].View.Contains(local) {
		t.Fatalf("ToLocal after the batch = %s, %v; want an address in %s", local, ok, va[0].View)
	}
	l = reopen(t, l, Options{})
	if got := l.Views(""); len(got) != 2 || !slices.ContainsFunc(got, func(v View) bool { return v.Peer == "a" && v.View == va[0].View }) {
		t.Fatalf("views after reopen %v, want a's %v among 2", got, va)
	}
	if got := l.TheirViews(""); len(got) != 2 {
		t.Fatalf("claims after reopen %v, want 2", got)
	}
	if v, err := l.PeerState("b"); err != nil || string(v) != "statement b" {
		t.Fatalf("PeerState(b) after reopen = %q, %v", v, err)
	}
}

// A write that fails inside a batch is undone alone, with its error: the
// others are committed, and nothing of it is left in memory or the file.
func TestBatchFailedWriteUndoneAlone(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	if _, err := l.SyncPeer("a", []netip.Prefix{pfx("10.1.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	err := l.Batch(func(b Batch) error {
		// a's range changes to one no pool can hold: its old view would go
		// to quarantine, then the allocation fails.
		if _, err := b.SyncPeer("a", []netip.Prefix{pfx("10.0.0.0/8")}); !errors.Is(err, ErrExhausted) {
			t.Errorf("SyncPeer of a /8 = %v, want ErrExhausted", err)
		}
		if err := b.RecordTheirView("b", pfx("10.0.0.0/16"), pfx("100.99.0.0/24")); !errors.Is(err, ErrInconsistentClaim) {
			t.Errorf("a claim of another size = %v, want ErrInconsistentClaim", err)
		}
		_, err := b.SyncPeer("b", []netip.Prefix{pfx("10.2.0.0/16")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for reopened := range 2 {
		if reopened == 1 {
			l = reopen(t, l, Options{})
		}
		if got := l.Views("a"); len(got) != 1 || got[0].Remote != pfx("10.1.0.0/16") {
			t.Fatalf("a's views %v: want its first one, untouched", got)
		}
		if q := l.Quarantine(); len(q) != 0 {
			t.Fatalf("quarantine %v: the failed sync's release was kept", q)
		}
		if got := l.TheirViews("b"); len(got) != 0 {
			t.Fatalf("b's claims %v, want none", got)
		}
		if got := l.Views("b"); len(got) != 1 {
			t.Fatalf("b's views %v: the write after the failed ones was lost", got)
		}
	}
}

// When the batch's function fails, none of its writes stay.
func TestBatchFailureUndoesAll(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	stop := errors.New("stop")
	err := l.Batch(func(b Batch) error {
		if _, err := b.SyncPeer("a", []netip.Prefix{pfx("10.0.0.0/16")}); err != nil {
			return err
		}
		if err := b.PutPeerStates(map[string][]byte{"a": []byte("x")}); err != nil {
			return err
		}
		return stop
	})
	if !errors.Is(err, stop) {
		t.Fatalf("Batch = %v, want the function's error", err)
	}
	for reopened := range 2 {
		if reopened == 1 {
			l = reopen(t, l, Options{})
		}
		if got := l.Views(""); len(got) != 0 {
			t.Fatalf("views %v after a failed batch", got)
		}
		if _, ok := l.ToLocal("a", netip.MustParseAddr("10.0.1.2")); ok {
			t.Fatal("a translation after a failed batch")
		}
		if _, err := l.PeerState("a"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("PeerState(a) = %v after a failed batch", err)
		}
	}
}
