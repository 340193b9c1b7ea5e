package ipam

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestLedgerFileIsPrivate(t *testing.T) {
	l, _ := openTest(t, Options{})
	fi, err := os.Stat(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("ledger mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestSecondOpenerFailsNamingTheFile(t *testing.T) {
	l, _ := openTest(t, Options{})
	for _, ro := range []bool{false, true} {
		start := time.Now()
		_, err := Open(l.Path(), Options{LockTimeout: 200 * time.Millisecond, ReadOnly: ro})
		if !errors.Is(err, ErrLocked) {
			t.Fatalf("second Open(readOnly=%v) = %v, want ErrLocked", ro, err)
		}
		if !strings.Contains(err.Error(), l.Path()) || !strings.Contains(err.Error(), fmt.Sprintf("(pid %d)", os.Getpid())) {
			t.Errorf("error %q does not name the file and the holder", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("second Open took %v with a 200ms lock timeout", d)
		}
	}
}

func fileHash(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestForeignOrCorruptFileIsRefusedAndLeftAlone(t *testing.T) {
	tests := []struct {
		name  string
		make  func(t *testing.T, path string)
		want  string
		class error
	}{
		{"text file", func(t *testing.T, path string) {
			os.WriteFile(path, bytes.Repeat([]byte("not a database\n"), 1000), 0o600)
		}, "invalid database", ErrCorrupt},
		{"bbolt file of another program", func(t *testing.T, path string) {
			rawBolt(t, path, func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
		}, `no "meta" bucket`, ErrCorrupt},
		{"wrong magic", func(t *testing.T, path string) {
			rawBolt(t, path, func(tx *bolt.Tx) error {
				b, _ := tx.CreateBucket(bucketMeta)
				return b.Put(keyMagic, []byte("something-else"))
			})
		}, `magic "something-else"`, ErrCorrupt},
		{"newer schema", func(t *testing.T, path string) {
			l, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			rawBolt(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte{0, 0, 0, 9}) })
		}, "schema version 9, this flotilla reads up to 1", ErrCorrupt},
		{"garbage record", func(t *testing.T, path string) {
			l, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			rawBolt(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketViews).Put([]byte("p\x00\x04junk"), []byte("x")) })
		}, "bucket views", ErrCorrupt},
		{"truncated ledger", func(t *testing.T, path string) {
			l, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			b, _ := os.ReadFile(path)
			os.WriteFile(path, b[:100], 0o600)
		}, "", ErrCorrupt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			tc.make(t, path)
			before := fileHash(t, path)
			for _, ro := range []bool{false, true} {
				l, err := Open(path, Options{ReadOnly: ro, LockTimeout: time.Second})
				if err == nil {
					l.Close()
					t.Fatalf("Open(readOnly=%v) accepted it", ro)
				}
				if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Open(readOnly=%v) = %v; want %v naming the file and %q", ro, err, tc.class, tc.want)
				}
			}
			if fileHash(t, path) != before {
				t.Fatal("refused file was modified")
			}
		})
	}
}

func rawBolt(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyFileFromInterruptedCreationIsInitialised(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.ViewOf("a", pfx("10.1.0.0/16")); err != nil {
		t.Fatal(err)
	}
}

func TestMigrationRunsOnceAndFailureLeavesFileAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.PutKey("identity", []byte("seed")); err != nil {
		t.Fatal(err)
	}
	l.Close()

	oldVersion, oldMigrations := schemaVersion, migrations
	t.Cleanup(func() { schemaVersion, migrations = oldVersion, oldMigrations })
	schemaVersion = 2

	migrations = []func(*bolt.Tx) error{func(*bolt.Tx) error { return errors.New("disk says no") }}
	before := fileHash(t, path)
	if _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), "migrate schema 1 to 2: disk says no") {
		t.Fatalf("failing migration: %v", err)
	}
	if fileHash(t, path) != before {
		t.Fatal("failed migration modified the file")
	}

	var runs atomic.Int32
	migrations = []func(*bolt.Tx) error{func(tx *bolt.Tx) error {
		runs.Add(1)
		return tx.Bucket(bucketKeys).Put([]byte("migrated"), []byte("yes"))
	}}
	for i := 0; i < 2; i++ {
		l, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		v, err := l.Key("migrated")
		seed, _ := l.Key("identity")
		l.Close()
		if err != nil || string(v) != "yes" || string(seed) != "seed" {
			t.Fatalf("after migration: %q %v, identity %q", v, err, seed)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("migration ran %d times", runs.Load())
	}
}

func TestKeys(t *testing.T) {
	l, _ := openTest(t, Options{})
	if _, err := l.Key("identity"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Key of a fresh ledger = %v, want ErrNotFound", err)
	}
	if err := l.PutKey("wireguard", []byte("private")); err != nil {
		t.Fatal(err)
	}
	var creates atomic.Int32
	var wg sync.WaitGroup
	got := make([][]byte, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := l.LoadOrCreateKey("identity", func() ([]byte, error) {
				n := creates.Add(1)
				return []byte(fmt.Sprintf("seed-%d", n)), nil
			})
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		}()
	}
	wg.Wait()
	if creates.Load() != 1 {
		t.Fatalf("create called %d times", creates.Load())
	}
	for _, v := range got {
		if string(v) != "seed-1" {
			t.Fatalf("LoadOrCreateKey returned %q, want seed-1 for everyone", v)
		}
	}
	if _, err := l.LoadOrCreateKey("federation-keyring", func() ([]byte, error) { return nil, errors.New("no entropy") }); err == nil || !strings.Contains(err.Error(), "no entropy") {
		t.Fatalf("failing create: %v", err)
	}
	if _, err := l.Key("federation-keyring"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed create stored something: %v", err)
	}
	l = reopen(t, l, Options{})
	for name, want := range map[string]string{"identity": "seed-1", "wireguard": "private"} {
		if v, err := l.Key(name); err != nil || string(v) != want {
			t.Errorf("after reopen Key(%s) = %q, %v", name, v, err)
		}
	}
}

func TestPeerState(t *testing.T) {
	l, _ := openTest(t, Options{})
	if _, err := l.PeerState("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("PeerState = %v", err)
	}
	if err := l.PutPeerState("a", []byte("established")); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, Options{})
	if v, err := l.PeerState("a"); err != nil || string(v) != "established" {
		t.Fatalf("PeerState after reopen = %q, %v", v, err)
	}
	if err := l.PutPeerState("a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := l.PeerState("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted PeerState = %v", err)
	}
}

// Several peers' states stored at once are all there after a reopen; nil
// deletes; an invalid peer ID stores nothing.
func TestPeerStates(t *testing.T) {
	l, _ := openTest(t, Options{})
	if err := l.PutPeerState("c", []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := l.PutPeerStates(map[string][]byte{"a": []byte("one"), "b": []byte("two"), "c": nil}); err != nil {
		t.Fatal(err)
	}
	if err := l.PutPeerStates(map[string][]byte{"a": []byte("changed"), "": []byte("bad")}); err == nil {
		t.Fatal("a state for an empty peer ID was accepted")
	}
	l = reopen(t, l, Options{})
	for peer, want := range map[string]string{"a": "one", "b": "two"} {
		if v, err := l.PeerState(peer); err != nil || string(v) != want {
			t.Fatalf("PeerState(%s) after reopen = %q, %v; want %q", peer, v, err, want)
		}
	}
	if _, err := l.PeerState("c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted PeerState = %v", err)
	}
}

func TestReadOnlyLedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if _, err := Open(path, Options{ReadOnly: true}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only open of a missing file = %v", err)
	}
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	setLocals(t, l, testLocals)
	l.ViewOf("a", pfx("10.0.0.0/16"))
	l.Close()
	before := fileHash(t, path)
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if v := ro.Views(""); len(v) != 1 || v[0].View != pfx("100.96.0.0/16") {
		t.Fatalf("read-only views = %+v", v)
	}
	if _, err := ro.ViewOf("b", pfx("10.0.0.0/16")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write to read-only ledger = %v", err)
	}
	if fileHash(t, path) != before {
		t.Fatal("read-only open modified the file")
	}
}
