package ipam

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestSnapshotOfALedgerInUse(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	const peers = 200
	done := make(chan error, 1)
	go func() {
		for i := 0; i < peers; i++ {
			if _, err := l.ViewOf(fmt.Sprintf("c%03d", i), pfx("10.0.0.0/24")); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	snapshots := 0
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished = true
		default:
		}
		s, err := OpenSnapshot(l.Path())
		if err != nil {
			t.Fatalf("snapshot %d: %v", snapshots, err)
		}
		snapshots++
		vs := s.Views("")
		// Peers are mapped in order: a consistent snapshot holds c000..cN.
		for i, v := range vs {
			if v.Peer != fmt.Sprintf("c%03d", i) {
				t.Fatalf("snapshot %d (tx %d): view %d belongs to %s", snapshots, s.SnapshotTx(), i, v.Peer)
			}
		}
		if err := checkInvariants(s); err != nil {
			t.Fatalf("snapshot %d: %v", snapshots, err)
		}
		if finished && len(vs) != peers {
			t.Fatalf("final snapshot has %d views, want %d", len(vs), peers)
		}
		s.Close()
	}
	t.Logf("%d snapshots taken while the ledger was written", snapshots)
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(l.Path()), ".ledger-snapshot-*"))
	if len(left) != 0 {
		t.Fatalf("snapshot copies left behind: %v", left)
	}
}

func TestSnapshotRefusesAForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	os.WriteFile(path, make([]byte, 8192), 0o600)
	if _, err := OpenSnapshot(path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("snapshot of zeros = %v, want ErrCorrupt", err)
	}
}
