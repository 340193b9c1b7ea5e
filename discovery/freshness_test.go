package discovery

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memStore is a SerialStore in memory, shared by the runs of one member as
// its ledger would be.
type memStore struct {
	mu      sync.Mutex
	keys    map[string][]byte
	failPut error
}

func (s *memStore) LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.keys[name]; ok {
		return bytes.Clone(v), nil
	}
	v, err := create()
	if err != nil {
		return nil, err
	}
	if s.keys == nil {
		s.keys = map[string][]byte{}
	}
	s.keys[name] = bytes.Clone(v)
	return v, nil
}

func (s *memStore) PutKey(name string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPut != nil {
		return s.failPut
	}
	if s.keys == nil {
		s.keys = map[string][]byte{}
	}
	s.keys[name] = bytes.Clone(value)
	return nil
}

func (s *memStore) serial() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return binary.BigEndian.Uint64(s.keys[serialKey])
}

// shiftedClock is the wall clock moved by an offset a test sets.
type shiftedClock struct{ offset atomic.Int64 }

func (c *shiftedClock) now() time.Time           { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *shiftedClock) set(offset time.Duration) { c.offset.Store(int64(offset)) }

func memberOf(n *testNode, id string) (Member, bool) {
	for _, m := range n.d.Snapshot().Members {
		if m.ClusterID == id {
			return m, true
		}
	}
	return Member{}, false
}

// A cluster restarted with its state and a clock an hour behind is seen
// again at once: its serial continues from the stored one instead of
// falling below what the others saw before the restart.
func TestRestartWithClockSetBackIsSeen(t *testing.T) {
	a := startNode(t, nodeOpts{})
	bid := mustIdentity(t)
	store := &memStore{}
	b := startNode(t, nodeOpts{id: &bid, serials: store, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	before := b.d.Snapshot().Self.Serial
	bAddr := b.addr()
	b.d.kill()
	waitUntil(t, 20*time.Second, func() error {
		if m, ok := memberOf(a, bid.ClusterID()); !ok || m.State != StateFailed {
			return fmt.Errorf("a does not report b failed: %+v", m)
		}
		return nil
	})

	var behind shiftedClock
	behind.set(-time.Hour)
	b2 := startNode(t, nodeOpts{id: &bid, serials: store, now: behind.now, bind: bAddr, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b2) })
	m, _ := memberOf(a, bid.ClusterID())
	if m.Record.Serial <= before {
		t.Errorf("restarted serial %d not above %d", m.Record.Serial, before)
	}
	if got := metricValue(t, a.reg, "flotilla_discovery_records_dropped_total", "reason="+ReasonStale); got != 0 {
		t.Errorf("%v records of the restarted member refused as stale", got)
	}
}

// The serial is stored before a record carries it: a record whose serial
// could not be stored is never published.
func TestSerialIsStoredBeforePublishing(t *testing.T) {
	store := &memStore{}
	d, err := New(Config{Identity: mustIdentity(t), Keys: [][]byte{testKey}, Protocol: testProtocol, Serials: store})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := store.serial(), d.Snapshot().Self.Serial; got != want {
		t.Fatalf("stored serial %d, published %d", got, want)
	}
	if err := d.SetEndpoint("192.0.2.1:51820"); err != nil {
		t.Fatal(err)
	}
	if got, want := store.serial(), d.Snapshot().Self.Serial; got != want {
		t.Fatalf("after an update: stored serial %d, published %d", got, want)
	}
	published := d.Snapshot().Self
	store.mu.Lock()
	store.failPut = errors.New("disk full")
	store.mu.Unlock()
	if err := d.SetEndpoint("192.0.2.2:51820"); err == nil {
		t.Fatal("record published with a serial that was not stored")
	}
	if now := d.Snapshot().Self; now.Serial != published.Serial || now.Endpoint != published.Endpoint {
		t.Errorf("record changed to %+v although its serial was not stored", now)
	}
	if _, err := New(Config{Identity: mustIdentity(t), Keys: [][]byte{testKey}, Protocol: testProtocol, Serials: store}); err == nil {
		t.Error("started although the first serial could not be stored")
	}
}

// A record with the serial of the one accepted but other content is
// refused: a cluster never issues one, so it is a forgery or a splice.
func TestEqualSerialWithOtherContentIsRefused(t *testing.T) {
	victim := mustIdentity(t)
	first, err := SignRecord(victim, Record{Protocol: 1, Serial: 7, Endpoint: "192.0.2.7:51820"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := SignRecord(victim, Record{Protocol: 1, Serial: 7, Endpoint: "203.0.113.66:51820"})
	if err != nil {
		t.Fatal(err)
	}
	a := startNode(t, nodeOpts{})
	f, ml := startForger(t, victim.ClusterID(), first, a)
	waitUntil(t, 10*time.Second, func() error {
		if m, ok := memberOf(a, victim.ClusterID()); !ok || m.State != StateAlive {
			return errors.New("first record not accepted")
		}
		return nil
	})
	f.setMeta(other)
	if err := ml.UpdateNode(time.Second); err != nil {
		t.Logf("update not acknowledged: %v", err)
	}
	waitUntil(t, 10*time.Second, func() error {
		if got := metricValue(t, a.reg, "flotilla_discovery_records_dropped_total", "reason="+ReasonSerialReused); got == 0 {
			return errors.New("no record refused for a reused serial")
		}
		return nil
	})
	if m, _ := memberOf(a, victim.ClusterID()); m.Record.Endpoint != "192.0.2.7:51820" {
		t.Errorf("endpoint %q, want the first record's", m.Record.Endpoint)
	}
}

// A departed member's highest serial is remembered for ForgetAfter: a
// replay of one of its older records is refused within the bound and
// accepted after it, when the memory is freed.
func TestDepartedSerialsAreForgottenAfterTheBound(t *testing.T) {
	var clock shiftedClock
	a := startNode(t, nodeOpts{now: clock.now})
	bid := mustIdentity(t)
	b := startNode(t, nodeOpts{id: &bid, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	old := (*delegate)(b.d).NodeMeta(metaSizeLimit)
	oldRec, err := DecodeRecord(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.d.SetEndpoint("192.0.2.9:51820"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() error {
		if m, _ := memberOf(a, bid.ClusterID()); m.Record.Endpoint != "192.0.2.9:51820" {
			return fmt.Errorf("a has b's endpoint %q", m.Record.Endpoint)
		}
		return nil
	})
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() error {
		if m, _ := memberOf(a, bid.ClusterID()); m.State != StateLeft {
			return fmt.Errorf("b is %q on a", m.State)
		}
		return nil
	})

	// Within the bound (past the hour after which the member itself is
	// forgotten, the witness that pruning ran at this time).
	clock.set(DefaultForgetAfter - time.Hour)
	waitUntil(t, 10*time.Second, func() error {
		if _, ok := memberOf(a, bid.ClusterID()); ok {
			return errors.New("departed member not yet pruned")
		}
		return nil
	})
	stale := metricValue(t, a.reg, "flotilla_discovery_records_dropped_total", "reason="+ReasonStale)
	startForger(t, bid.ClusterID(), old, a)
	waitUntil(t, 10*time.Second, func() error {
		if got := metricValue(t, a.reg, "flotilla_discovery_records_dropped_total", "reason="+ReasonStale); got == stale {
			return errors.New("replayed record not refused as stale")
		}
		return nil
	})
	if slices.Contains(a.d.Alive(), bid.ClusterID()) {
		t.Fatal("replay of an old record accepted within the bound")
	}

	// Past the bound the serial is forgotten: the replay, still gossiped,
	// is taken as the member's record.
	clock.set(DefaultForgetAfter + time.Hour)
	waitUntil(t, 20*time.Second, func() error {
		m, ok := memberOf(a, bid.ClusterID())
		if !ok || m.State != StateAlive || m.Record.Serial != oldRec.Serial {
			return fmt.Errorf("b on a: %+v, want alive with the replayed serial %d", m, oldRec.Serial)
		}
		return nil
	})
}
