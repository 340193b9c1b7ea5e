package ipam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OpenSnapshot opens a read-only copy of the ledger at path as of its last
// committed transaction, without taking the file's lock, so that operators
// can inspect the ledger of a running agent. The copy is private (0600, in
// the ledger's directory) and unlinked as soon as it is open.
//
// It is consistent because bbolt never overwrites a page reachable from the
// newest committed meta page until a later transaction has committed: if
// the newest transaction ID is the same before and after the copy, every
// page of that transaction was copied intact. Otherwise it tries again.
func OpenSnapshot(path string) (*Ledger, error) {
	// A copy races the agent's commits; back off between attempts so a
	// burst of writes (a negotiation storm) passes, for up to about 3 s.
	var lastErr error
	wait := time.Millisecond
	for attempt := 0; attempt < 40; attempt++ {
		l, err := trySnapshot(path)
		if err == nil || !errors.Is(err, errMoved) {
			return l, err
		}
		lastErr = err
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
	return nil, fmt.Errorf("snapshot ledger %s: %w (the agent is writing continuously; try again)", path, lastErr)
}

var errMoved = errors.New("ledger changed while it was copied")

func trySnapshot(path string) (*Ledger, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot ledger %s: %w", path, err)
	}
	defer src.Close()
	before, err := newestTx(src)
	if err != nil {
		return nil, fmt.Errorf("snapshot ledger %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ledger-snapshot-*")
	if err != nil {
		return nil, fmt.Errorf("snapshot ledger %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := io.Copy(tmp, io.NewSectionReader(src, 0, 1<<62)); err != nil {
		return nil, fmt.Errorf("snapshot ledger %s: copy: %w", path, err)
	}
	after, err := newestTx(src)
	if err != nil {
		return nil, fmt.Errorf("snapshot ledger %s: %w", path, err)
	}
	if after != before {
		return nil, errMoved
	}
	l, err := Open(tmp.Name(), Options{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("snapshot ledger %s: %w", path, err)
	}
	var got uint64
	l.db.View(func(tx *bolt.Tx) error { got = uint64(tx.ID()); return nil })
	if got != before {
		l.Close()
		return nil, errMoved
	}
	l.path = path
	l.snapshotTx = got
	return l, nil
}

// SnapshotTx returns the transaction a ledger from OpenSnapshot shows, or 0.
func (l *Ledger) SnapshotTx() uint64 { return l.snapshotTx }

// newestTx reads bbolt's two meta pages and returns the highest transaction
// ID among those whose checksum verifies.
func newestTx(f *os.File) (uint64, error) {
	const (
		pageHeader = 16
		metaLen    = 64 // magic .. checksum
		boltMagic  = 0xED0CDAED
	)
	var page [pageHeader + metaLen]byte
	var best uint64
	found := false
	pageSize := int64(os.Getpagesize()) // replaced by the first meta page's own
	for i := 0; i < 2; i++ {
		if _, err := f.ReadAt(page[:], int64(i)*pageSize); err != nil {
			return 0, fmt.Errorf("read meta page %d: %w", i, err)
		}
		m := page[pageHeader:]
		h := fnv.New64a()
		h.Write(m[:56])
		if binary.NativeEndian.Uint32(m[0:]) != boltMagic || binary.NativeEndian.Uint64(m[56:]) != h.Sum64() {
			continue // torn by a commit in progress: the caller retries
		}
		if i == 0 {
			pageSize = int64(binary.NativeEndian.Uint32(m[8:]))
			if pageSize < 1024 {
				return 0, fmt.Errorf("%w: page size %d", ErrCorrupt, pageSize)
			}
		}
		if tx := binary.NativeEndian.Uint64(m[48:]); !found || tx > best {
			best, found = tx, true
		}
	}
	if !found {
		return 0, fmt.Errorf("%w: no meta page verifies", ErrCorrupt)
	}
	return best, nil
}
