package ipam

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// Replication: the active agent copies its ledger to the standby as
// snapshots (docs/ha.md). Every committed write adds one to the ledger's
// generation; a snapshot carries the generation it was taken at, and the
// ledger records which snapshot generation it last wrote or restored
// (Replicated), so a replica can tell "the newest snapshot is mine" from
// "another replica wrote since".

var (
	keyGeneration = []byte("generation")
	keyReplicated = []byte("replicated")
)

// ErrForeignSnapshot is returned by Restore for a snapshot of another
// cluster's ledger; the ledger is left as it was.
var ErrForeignSnapshot = errors.New("snapshot of another cluster's ledger")

// Generation returns the number of writes committed to the ledger since it
// was created (or the generation of the snapshot it was restored from,
// plus the writes since). It only grows.
func (l *Ledger) Generation() uint64 {
	l.genMu.Lock()
	defer l.genMu.Unlock()
	return l.gen
}

// Replicated returns the generation of the snapshot this ledger last wrote
// or was restored from; 0 if none.
func (l *Ledger) Replicated() uint64 {
	l.genMu.Lock()
	defer l.genMu.Unlock()
	return l.replicated
}

// WaitGeneration blocks until the generation is above after, and returns
// it; or returns ctx's error.
func (l *Ledger) WaitGeneration(ctx context.Context, after uint64) (uint64, error) {
	for {
		l.genMu.Lock()
		gen, changed := l.gen, l.genChanged
		l.genMu.Unlock()
		if gen > after {
			return gen, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// ShouldRestore says whether a replica must restore the newest snapshot,
// of generation newest, before it acts: another replica wrote a snapshot
// since this ledger last wrote or restored one, or this ledger is behind
// it (a wiped or fresh state directory is at generation 0).
func (l *Ledger) ShouldRestore(newest uint64) bool {
	if newest == 0 {
		return false
	}
	l.genMu.Lock()
	defer l.genMu.Unlock()
	return newest != l.replicated || l.gen < newest
}

// MarkReplicated records that the snapshot of generation gen is the newest
// one written. It is not a change to replicate: the generation stays.
func (l *Ledger) MarkReplicated(gen uint64) error {
	if l.readOnly {
		return ErrReadOnly
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyReplicated, binary.BigEndian.AppendUint64(nil, gen))
	})
	if err != nil {
		return fmt.Errorf("mark ledger replicated at generation %d: %w", gen, err)
	}
	l.genMu.Lock()
	l.replicated = gen
	l.genMu.Unlock()
	return nil
}

// loadGeneration reads the generation and the replicated mark of an
// opened file.
func (l *Ledger) loadGeneration(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	for _, f := range []struct {
		key []byte
		to  *uint64
	}{{keyGeneration, &l.gen}, {keyReplicated, &l.replicated}} {
		v := meta.Get(f.key)
		switch len(v) {
		case 0:
			*f.to = 0
		case 8:
			*f.to = binary.BigEndian.Uint64(v)
		default:
			return fmt.Errorf("%w: %s is %d bytes, want 8", ErrCorrupt, f.key, len(v))
		}
	}
	l.genChanged = make(chan struct{})
	return nil
}

// bumpGeneration adds one to the generation inside tx, the commit of a
// write; committed must be called once the commit is durable.
func (l *Ledger) bumpGeneration(tx *bolt.Tx) (next uint64, err error) {
	l.genMu.Lock()
	next = l.gen + 1
	l.genMu.Unlock()
	return next, tx.Bucket(bucketMeta).Put(keyGeneration, binary.BigEndian.AppendUint64(nil, next))
}

// committed publishes a durable generation and wakes WaitGeneration.
func (l *Ledger) committed(gen uint64) {
	l.genMu.Lock()
	defer l.genMu.Unlock()
	l.gen = gen
	close(l.genChanged)
	l.genChanged = make(chan struct{})
}

// Snapshot is a ledger's content at one generation, as Ledger.Snapshot
// takes it and DecodeSnapshot reads it back.
type Snapshot struct {
	Generation uint64
	Schema     uint32
	// Buckets holds every bucket but the file's header, by name, its
	// entries by key.
	Buckets map[string]map[string][]byte
}

// Key returns the value of a key of the agent's (Ledger.Key) in s.
func (s *Snapshot) Key(name string) []byte { return s.Buckets[string(bucketKeys)][name] }

// snapshotMagic starts every encoded snapshot; the format version follows.
const (
	snapshotMagic   = "flotilla-ledger-snapshot"
	snapshotVersion = 1
)

// Snapshot returns the ledger's content at its current generation,
// encoded: the identity's private key and every other secret included,
// so it must be stored where only the agent reads it.
func (l *Ledger) Snapshot() (gen uint64, encoded []byte, err error) {
	s := &Snapshot{Schema: schemaVersion, Buckets: map[string]map[string][]byte{}}
	err = l.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyGeneration); len(v) == 8 {
			s.Generation = binary.BigEndian.Uint64(v)
		}
		for _, name := range allBuckets[1:] {
			b := tx.Bucket(name)
			if b == nil {
				continue
			}
			m := map[string][]byte{}
			if err := b.ForEach(func(k, v []byte) error { m[string(k)] = bytes.Clone(v); return nil }); err != nil {
				return err
			}
			s.Buckets[string(name)] = m
		}
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("snapshot ledger %s: %w", l.path, err)
	}
	return s.Generation, s.Encode(), nil
}

// Encode writes s as magic, version, schema, generation, the buckets in
// name order and their entries in key order (each a length-prefixed
// name and count, then length-prefixed keys and values), and a SHA-256
// of everything before it.
func (s *Snapshot) Encode() []byte {
	b := []byte(snapshotMagic)
	b = binary.BigEndian.AppendUint32(b, snapshotVersion)
	b = binary.BigEndian.AppendUint32(b, s.Schema)
	b = binary.BigEndian.AppendUint64(b, s.Generation)
	names := make([]string, 0, len(s.Buckets))
	for name := range s.Buckets {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		entries := s.Buckets[name]
		b = appendBytes(b, []byte(name))
		b = binary.AppendUvarint(b, uint64(len(entries)))
		keys := make([]string, 0, len(entries))
		for k := range entries {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b = appendBytes(b, []byte(k))
			b = appendBytes(b, entries[k])
		}
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

// ErrBadSnapshot is wrapped by DecodeSnapshot's errors: the bytes are not
// a snapshot this version of flotilla reads.
var ErrBadSnapshot = errors.New("not a readable flotilla ledger snapshot")

// DecodeSnapshot reads an encoded snapshot, checking its checksum, its
// format and that every bucket is one this version keeps.
func DecodeSnapshot(b []byte) (*Snapshot, error) {
	const header = len(snapshotMagic) + 4 + 4 + 8
	if len(b) < header+sha256.Size {
		return nil, fmt.Errorf("%w: %d bytes, too short", ErrBadSnapshot, len(b))
	}
	if !bytes.HasPrefix(b, []byte(snapshotMagic)) {
		return nil, fmt.Errorf("%w: no %q header", ErrBadSnapshot, snapshotMagic)
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("%w: checksum mismatch (truncated or edited)", ErrBadSnapshot)
	}
	r := body[len(snapshotMagic):]
	if v := binary.BigEndian.Uint32(r); v != snapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, this flotilla reads %d", ErrBadSnapshot, v, snapshotVersion)
	}
	s := &Snapshot{
		Schema:     binary.BigEndian.Uint32(r[4:]),
		Generation: binary.BigEndian.Uint64(r[8:]),
		Buckets:    map[string]map[string][]byte{},
	}
	r = r[16:]
	if s.Schema == 0 || s.Schema > schemaVersion {
		return nil, fmt.Errorf("%w: schema version %d, this flotilla reads up to %d (written by a newer version?)", ErrBadSnapshot, s.Schema, schemaVersion)
	}
	d := decoder{r: r}
	n := d.count()
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := string(d.bytes())
		if d.err != nil {
			break
		}
		if !slices.ContainsFunc(allBuckets[1:], func(b []byte) bool { return string(b) == name }) {
			return nil, fmt.Errorf("%w: unknown bucket %q", ErrBadSnapshot, name)
		}
		if _, dup := s.Buckets[name]; dup {
			return nil, fmt.Errorf("%w: bucket %q twice", ErrBadSnapshot, name)
		}
		entries := map[string][]byte{}
		m := d.count()
		for j := uint64(0); j < m && d.err == nil; j++ {
			k, v := d.bytes(), d.bytes()
			if d.err == nil && len(k) == 0 {
				d.err = fmt.Errorf("empty key in bucket %q", name)
			}
			entries[string(k)] = v
		}
		if d.err == nil && uint64(len(entries)) != m {
			d.err = fmt.Errorf("a key twice in bucket %q", name)
		}
		s.Buckets[name] = entries
	}
	if d.err == nil && len(d.r) > 0 {
		d.err = fmt.Errorf("%d bytes after the last bucket", len(d.r))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, d.err)
	}
	return s, nil
}

type decoder struct {
	r   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.r)
	if n <= 0 {
		d.err = errors.New("bad length")
		return 0
	}
	d.r = d.r[n:]
	return v
}

// count reads a number of items, each at least one byte long.
func (d *decoder) count() uint64 {
	n := d.uvarint()
	if n > uint64(len(d.r)) {
		d.err = fmt.Errorf("count %d past the end", n)
		return 0
	}
	return n
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.r)) {
		d.err = fmt.Errorf("length %d past the end", n)
		return nil
	}
	v := bytes.Clone(d.r[:n])
	d.r = d.r[n:]
	return v
}

// Restore replaces the ledger's content with s's in one transaction, and
// its generation with s's, which it marks as replicated. A snapshot whose
// key sameKey (the cluster's identity) differs from this ledger's is
// refused with ErrForeignSnapshot, unless this ledger never wrote nor
// restored a snapshot; one that does not load as a ledger with
// ErrBadSnapshot. Refused, nothing local changes.
//
// A ledger that never wrote nor restored a snapshot was never the state
// the cluster recorded: a replica that made an identity and lost the
// Lease before its first snapshot reached the API server, while the
// replica after it made another and recorded that one. Such a ledger
// yields to the snapshot; it is first copied to setAside (the ledger's
// path with ".superseded-" and the time), so that nothing is lost.
func (l *Ledger) Restore(s *Snapshot, sameKey string) (setAside string, err error) {
	if l.readOnly {
		return "", ErrReadOnly
	}
	if sameKey != "" {
		if mine, err := l.get(bucketKeys, sameKey); err == nil && !bytes.Equal(mine, s.Key(sameKey)) {
			if l.Replicated() != 0 {
				return "", fmt.Errorf("restore ledger %s from generation %d: %w: its key %q differs from this ledger's", l.path, s.Generation, ErrForeignSnapshot, sameKey)
			}
			setAside = l.path + ".superseded-" + l.now().UTC().Format("20060102T150405.000Z")
			if err := l.db.View(func(tx *bolt.Tx) error { return tx.CopyFile(setAside, 0o600) }); err != nil {
				return "", fmt.Errorf("restore ledger %s from generation %d: its key %q differs from this never replicated ledger's, which could not be set aside: %w", l.path, s.Generation, sameKey, err)
			}
		}
	}
	return setAside, l.restore(s)
}

func (l *Ledger) restore(s *Snapshot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var st *state
	err := l.db.Update(func(tx *bolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%w: %v", ErrBadSnapshot, r)
			}
		}()
		for _, name := range allBuckets[1:] {
			if tx.Bucket(name) != nil {
				if err := tx.DeleteBucket(name); err != nil {
					return err
				}
			}
			b, err := tx.CreateBucket(name)
			if err != nil {
				return err
			}
			for k, v := range s.Buckets[string(name)] {
				if err := b.Put([]byte(k), v); err != nil {
					return fmt.Errorf("%w: bucket %s key %q: %v", ErrBadSnapshot, name, k, err)
				}
			}
		}
		for schema := s.Schema; schema < schemaVersion; schema++ {
			if err := migrations[schema-1](tx); err != nil {
				return fmt.Errorf("migrate schema %d to %d: %w", schema, schema+1, err)
			}
		}
		gen := binary.BigEndian.AppendUint64(nil, s.Generation)
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyGeneration, gen); err != nil {
			return err
		}
		if err := meta.Put(keyReplicated, gen); err != nil {
			return err
		}
		if st, err = loadState(tx); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("restore ledger %s from generation %d: %w", l.path, s.Generation, err)
	}
	l.st = st
	l.index.Store(buildIndex(st))
	l.genMu.Lock()
	l.replicated = s.Generation
	l.genMu.Unlock()
	l.committed(s.Generation)
	return nil
}
