package ipam

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A grant put is there after a reopen, replaced by the next, and gone
// once deleted; bad names and empty values are refused and store nothing.
func TestGrants(t *testing.T) {
	l, _ := openTest(t, Options{})
	if _, err := l.Grant("ca"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Grant of nothing = %v, want ErrNotFound", err)
	}
	for _, put := range [][2]string{{"ca", "sealed-1"}, {"cb", "sealed-b"}, {"ca", "sealed-2"}} {
		if err := l.PutGrant(put[0], []byte(put[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.PutGrant("a b", []byte("x")); !errors.Is(err, ErrInvalidPeer) {
		t.Fatalf("PutGrant with a bad name = %v, want ErrInvalidPeer", err)
	}
	if err := l.PutGrant("cc", nil); err == nil {
		t.Fatal("PutGrant stored an empty grant")
	}
	l = reopen(t, l, Options{})
	if v, err := l.Grant("ca"); err != nil || string(v) != "sealed-2" {
		t.Fatalf("Grant after reopen = %q, %v; want the last one put", v, err)
	}
	if got, err := l.Grants(); err != nil || !slices.Equal(got, []string{"ca", "cb"}) {
		t.Fatalf("Grants = %v, %v", got, err)
	}
	if err := l.DeleteGrant("ca"); err != nil {
		t.Fatal(err)
	}
	if err := l.DeleteGrant("ca"); err != nil {
		t.Fatalf("deleting what is gone: %v", err)
	}
	l = reopen(t, l, Options{})
	if _, err := l.Grant("ca"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted grant = %v", err)
	}
	if got, _ := l.Grants(); !slices.Equal(got, []string{"cb"}) {
		t.Fatalf("Grants after delete = %v", got)
	}
}

// A ledger written before the grants bucket existed is read as holding
// no grants by a read-only open (flotilla ledger show), and gets the
// bucket at its next read-write open.
func TestLedgerFromBeforeGrants(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.PutPeerState("ca", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	l.Close()
	rawBolt(t, path, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketGrants) })

	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a ledger without grants: %v", err)
	}
	if got, err := ro.Grants(); err != nil || len(got) != 0 {
		t.Fatalf("Grants = %v, %v; want none", got, err)
	}
	if _, err := ro.Grant("ca"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Grant = %v, want ErrNotFound", err)
	}
	if v, err := ro.PeerState("ca"); err != nil || string(v) != "hello" {
		t.Fatalf("PeerState = %q, %v", v, err)
	}
	ro.Close()

	rw, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if err := rw.PutGrant("ca", []byte("sealed")); err != nil {
		t.Fatalf("PutGrant after upgrade: %v", err)
	}
}
