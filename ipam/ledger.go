// Package ipam holds the ledger: the agent's crash-safe bbolt file that
// decides how this cluster addresses each peer's networks (its views of
// them), records how each peer addresses ours, keeps released views in
// quarantine before reuse, and stores the agent's secrets and what other
// packages keep per peer (peering's statements, the grants received).
//
// All writes go through one transaction each and are fsynced before the
// call returns; address translation (ToLocal, ToRemote) is served from an
// in-memory index rebuilt after every commit. See docs/ipam.md.
package ipam

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// FileName is the ledger's file name inside the agent's state directory.
const FileName = "ledger.db"

// Defaults for Options.
const (
	DefaultLockTimeout = 3 * time.Second
	DefaultQuarantine  = time.Hour
)

// DefaultPools are the remap pools views are drawn from, tried in order.
// See docs/ipam.md for why these rarely collide with real networks.
var DefaultPools = []netip.Prefix{
	netip.MustParsePrefix("100.96.0.0/11"),
	netip.MustParsePrefix("100.64.0.0/11"),
	netip.MustParsePrefix("fddc:467:9000::/40"),
}

var (
	// ErrNotFound is returned for a key, peer state or view that is not there.
	ErrNotFound = errors.New("not found")
	// ErrLocked is returned when another process holds the ledger.
	ErrLocked = errors.New("ledger in use by another process")
	// ErrCorrupt is returned for a file that is not a readable Flotilla
	// ledger; the file is left as it was.
	ErrCorrupt = errors.New("not a readable flotilla ledger")
	// ErrExhausted is returned when no pool has a free block of the size needed.
	ErrExhausted = errors.New("remap pool exhausted")
	// ErrInconsistentClaim is returned when a peer's view of our networks
	// contradicts itself.
	ErrInconsistentClaim = errors.New("inconsistent claim")
	// ErrReadOnly is returned by writes to a ledger opened read-only.
	ErrReadOnly = errors.New("ledger opened read-only")
)

// Options configure Open. The zero value is usable.
type Options struct {
	// LockTimeout bounds how long Open waits for another process to let go
	// of the file. Zero means DefaultLockTimeout.
	LockTimeout time.Duration
	// ReadOnly opens without creating or writing; it shares the lock with
	// other readers but not with a writer.
	ReadOnly bool
	// Pools are the ranges views are remapped into, tried in order.
	// Nil means DefaultPools.
	Pools []netip.Prefix
	// Quarantine is how long a released view stays unusable for others.
	// Zero means DefaultQuarantine; negative disables quarantine.
	Quarantine time.Duration
	// Now is the clock used for "since" and quarantine; nil means time.Now.
	Now func() time.Time

	noSync bool // for tests of pure logic only: skip fsync
}

// Ledger is an open ledger file. Its methods are safe for concurrent use.
type Ledger struct {
	db         *bolt.DB
	path       string
	readOnly   bool
	snapshotTx uint64 // set by OpenSnapshot
	pools      []netip.Prefix
	quarantine time.Duration
	now        func() time.Time

	mu    sync.RWMutex // writers hold it exclusively while they edit st
	st    *state
	index atomic.Pointer[index]

	genMu      sync.Mutex // guards the three below (replication.go)
	gen        uint64
	replicated uint64
	genChanged chan struct{} // closed and replaced at each commit
}

// schemaVersion is the layout this code writes. migrations[i] upgrades a
// file from schema i+1 to i+2, inside the transaction that opens it.
var (
	schemaVersion = uint32(1)
	migrations    []func(tx *bolt.Tx) error
)

const magic = "flotilla-ledger"

var (
	bucketMeta       = []byte("meta")
	bucketKeys       = []byte("keys")
	bucketLocal      = []byte("local")
	bucketViews      = []byte("views")
	bucketTheirs     = []byte("theirs")
	bucketQuarantine = []byte("quarantine")
	bucketPeers      = []byte("peers")
	bucketGrants     = []byte("grants")
	allBuckets       = [][]byte{bucketMeta, bucketKeys, bucketLocal, bucketViews, bucketTheirs, bucketQuarantine, bucketPeers, bucketGrants}
	// addedBuckets came after schema 1 without a migration: a read-write
	// open creates them, and a read-only open of a file written before
	// them (flotilla ledger show of an older agent's ledger) reads them as
	// empty.
	addedBuckets = [][]byte{bucketGrants}

	keyMagic  = []byte("magic")
	keySchema = []byte("schema")
)

// Open opens the ledger at path, creating it with mode 0600 unless
// opts.ReadOnly. A second process opening the same file fails after
// opts.LockTimeout with an error wrapping ErrLocked. A file that is not a
// Flotilla ledger, or was written by a newer schema, is refused with
// ErrCorrupt and left unmodified.
func Open(path string, opts Options) (*Ledger, error) {
	l := &Ledger{path: path, readOnly: opts.ReadOnly, pools: opts.Pools, quarantine: opts.Quarantine, now: opts.Now}
	if l.pools == nil {
		l.pools = DefaultPools
	}
	for _, p := range l.pools {
		if err := CheckRange(p); err != nil {
			return nil, fmt.Errorf("open ledger %s: pool: %w", path, err)
		}
	}
	if l.quarantine == 0 {
		l.quarantine = DefaultQuarantine
	}
	if l.now == nil {
		l.now = time.Now
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}

	// Inspect an existing file read-only first, so that nothing is ever
	// written to a file we would refuse.
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 && !opts.ReadOnly {
		db, err := openBolt(path, true, timeout)
		if err != nil {
			return nil, err
		}
		err = db.View(func(tx *bolt.Tx) error { _, err := checkHeader(tx, true); return err })
		db.Close()
		if err != nil {
			return nil, fmt.Errorf("open ledger %s: %w", path, err)
		}
	} else if opts.ReadOnly && err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}

	db, err := openBolt(path, opts.ReadOnly, timeout)
	if err != nil {
		return nil, err
	}
	db.NoSync = opts.noSync
	l.db = db
	if err := l.prepare(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	return l, nil
}

func openBolt(path string, readOnly bool, timeout time.Duration) (db *bolt.DB, err error) {
	defer func() {
		// bbolt panics on some malformed pages; a foreign file must not
		// take the agent down.
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("open ledger %s: %w: %v", path, ErrCorrupt, r)
		}
	}()
	if !readOnly {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("open ledger %s: %w", path, err)
		}
	}
	// The freelist is rebuilt on open instead of written on every commit:
	// one page less to sync per write, and the ledger is small.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: readOnly, NoFreelistSync: true})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		holder := ""
		if pid := lockHolder(path); pid > 0 {
			holder = fmt.Sprintf(" (pid %d)", pid)
		}
		return nil, fmt.Errorf("open ledger %s: %w%s, waited %s", path, ErrLocked, holder, timeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, fmt.Errorf("open ledger %s: %w: %v", path, ErrCorrupt, err)
	case err != nil:
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	return db, nil
}

// checkHeader reads the schema of an existing ledger. A file with no
// buckets at all is a ledger whose creation was interrupted: fresh is
// true and the caller initialises it.
func checkHeader(tx *bolt.Tx, allowFresh bool) (schema uint32, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrCorrupt, r)
		}
	}()
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		empty := true
		_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
		if empty && allowFresh {
			return 0, nil
		}
		return 0, fmt.Errorf("%w: no %q bucket (a bbolt file of some other program?)", ErrCorrupt, bucketMeta)
	}
	if m := meta.Get(keyMagic); !bytes.Equal(m, []byte(magic)) {
		return 0, fmt.Errorf("%w: magic %q, want %q", ErrCorrupt, m, magic)
	}
	v := meta.Get(keySchema)
	if len(v) != 4 {
		return 0, fmt.Errorf("%w: schema version is %d bytes, want 4", ErrCorrupt, len(v))
	}
	schema = binary.BigEndian.Uint32(v)
	if schema == 0 || schema > schemaVersion {
		return 0, fmt.Errorf("%w: schema version %d, this flotilla reads up to %d (written by a newer version?)", ErrCorrupt, schema, schemaVersion)
	}
	return schema, nil
}

// prepare creates or migrates the layout and loads the state.
func (l *Ledger) prepare() error {
	load := func(tx *bolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%w: %v", ErrCorrupt, r)
			}
		}()
		st, err := loadState(tx)
		if err != nil {
			return err
		}
		if err := l.loadGeneration(tx); err != nil {
			return err
		}
		l.st = st
		l.index.Store(buildIndex(st))
		return nil
	}
	if l.readOnly {
		return l.db.View(func(tx *bolt.Tx) error {
			schema, err := checkHeader(tx, false)
			if err != nil {
				return err
			}
			if schema != schemaVersion {
				return fmt.Errorf("%w: schema version %d needs migration to %d; open it once read-write", ErrCorrupt, schema, schemaVersion)
			}
			return load(tx)
		})
	}
	return l.db.Update(func(tx *bolt.Tx) error {
		schema, err := checkHeader(tx, true)
		if err != nil {
			return err
		}
		if schema == 0 {
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			if err := meta.Put(keyMagic, []byte(magic)); err != nil {
				return err
			}
			schema = schemaVersion
		}
		for ; schema < schemaVersion; schema++ {
			if err := migrations[schema-1](tx); err != nil {
				return fmt.Errorf("migrate schema %d to %d: %w", schema, schema+1, err)
			}
		}
		if err := tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, schemaVersion)); err != nil {
			return err
		}
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		return load(tx)
	})
}

// Path returns the file the ledger was opened from.
func (l *Ledger) Path() string { return l.path }

// Close releases the file and its lock.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("close ledger %s: %w", l.path, err)
	}
	return nil
}

// update runs fn in one read-write transaction. fn edits the state in
// place under the write lock and logs how to undo each edit; if the
// transaction fails the edits are undone, so memory never runs ahead of
// the file. The translation index is swapped once the commit is durable.
func (l *Ledger) update(fn func(t *txn) error) error {
	if l.readOnly {
		return ErrReadOnly
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t := &txn{st: l.st, now: l.now(), l: l, changed: map[string]bool{}}
	var gen uint64
	err := l.db.Update(func(tx *bolt.Tx) error {
		t.tx = tx
		if err := t.purgeExpired(); err != nil {
			return err
		}
		if err := fn(t); err != nil {
			return err
		}
		var err error
		gen, err = l.bumpGeneration(tx)
		return err
	})
	if err != nil {
		for i := len(t.undo) - 1; i >= 0; i-- {
			t.undo[i]()
		}
		return err
	}
	if len(t.changed) > 0 {
		l.index.Store(l.index.Load().with(t.st, t.changed))
	}
	l.committed(gen)
	return nil
}

// read gives fn the current state; fn must not modify it.
func (l *Ledger) read(fn func(st *state)) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	fn(l.st)
}
