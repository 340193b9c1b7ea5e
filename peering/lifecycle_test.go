package peering

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/ipam"
)

// A member that fails keeps its tunnel for the grace period, then loses
// tunnel and view.
func TestUnreachableGracePeriod(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a, b := newNode(t, net, nodeOptions{clock: clk}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	a.eng.MemberChanged(b.member(false))
	inPhase(t, a, b, PhaseUnreachable)
	if _, ok := a.dp.peer(b.id.ClusterID()); !ok {
		t.Fatal("tunnel removed before the grace period ended")
	}
	clk.Add(2 * time.Minute)
	within(t, "tunnel removed after the grace period", func() error {
		if _, ok := a.dp.peer(b.id.ClusterID()); ok {
			return errors.New("still configured")
		}
		if len(a.ledger.Quarantine()) != 1 {
			return fmt.Errorf("%d views in quarantine, want 1", len(a.ledger.Quarantine()))
		}
		return nil
	})
}

// A peer gone for good leaves nothing running: its sender ends and its
// state is forgotten, after a last state saying what happened. Should it
// come back, it connects again, and its older statements are still
// refused.
func TestGonePeerIsForgotten(t *testing.T) {
	net := &network{}
	var mu sync.Mutex
	var fromB [][]byte
	clk := &clock{t: time.Now()}
	a, b, c := newNode(t, net, nodeOptions{clock: clk}), newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	net.tap = func(to string, msg []byte) {
		if to == a.id.ClusterID() {
			mu.Lock()
			fromB = append(fromB, msg)
			mu.Unlock()
		}
	}
	meet(a, b, c)
	within(t, "connected", func() error { return errors.Join(connected(a, b), connected(a, c)) })
	if n := a.eng.sendersAlive.Load(); n != 2 {
		t.Fatalf("%d senders on a, want 2", n)
	}

	a.eng.MemberChanged(b.member(false))
	inPhase(t, a, b, PhaseUnreachable)
	within(t, "sender to b ended", func() error {
		if n := a.eng.sendersAlive.Load(); n != 1 {
			return fmt.Errorf("%d senders on a, want 1", n)
		}
		return nil
	})
	clk.Add(2 * time.Minute)
	within(t, "b forgotten", func() error {
		if n := peersKnown(a); n != 1 {
			return fmt.Errorf("a keeps state of %d peers", n)
		}
		return nil
	})
	last, _ := a.rec.latest(b.id.ClusterID())
	if last.Phase != PhaseUnreachable || !strings.Contains(last.Member.Message, "removed") {
		t.Fatalf("last state of b: %s, %+v", last.Phase, last.Member)
	}
	if err := connected(a, c); err != nil {
		t.Fatalf("forgetting b disturbed c: %v", err)
	}

	a.eng.MemberChanged(b.member(true))
	within(t, "b connected again", func() error { return connected(a, b) })
	mu.Lock()
	oldest := fromB[0]
	mu.Unlock()
	a.eng.Receive(oldest)
	refusedOnce(t, "b's oldest statement refused", a, "replayed")
}

// A restarted engine configures the data path from its ledger before any
// member is heard from, so a restart does not drop traffic.
func TestRestartRestoresDataPathFromLedger(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	before, _ := a.dp.peer(b.id.ClusterID())
	a.stop()
	net.mu.Lock()
	delete(net.engines, a.id.ClusterID())
	net.mu.Unlock()

	a2 := newNode(t, &network{}, nodeOptions{seed: a}) // hears nobody
	<-a2.eng.Ready()
	got, ok := a2.dp.peer(b.id.ClusterID())
	if !ok {
		t.Fatal("restarted agent did not restore the tunnel peer")
	}
	if got.Views[0] != before.Views[0] || got.ViewsOfMe[0] != before.ViewsOfMe[0] || got.PublicKey != before.PublicKey {
		t.Fatalf("restored %+v, had %+v", got, before)
	}
}

// A deleted Peer comes back per policy even when nothing about the peer
// changed (manual policy, both sides pending): the admin needs an object
// to accept.
func TestDeletedPeerIsRecreated(t *testing.T) {
	net := &network{}
	manual := nodeOptions{policy: PolicyManual}
	a, b := newNode(t, net, manual), newNode(t, net, manual)
	meet(a, b)
	id := b.id.ClusterID()
	inPhase(t, a, b, PhaseDiscovered)
	a.eng.SpecDeleted(id)
	within(t, "b's Peer withdrawn, then published again", func() error {
		h := a.rec.history(id)
		i := slices.IndexFunc(h, func(ev event) bool { return ev.withdraw == id })
		if i < 0 {
			return errors.New("not withdrawn")
		}
		if i == len(h)-1 {
			return errors.New("not published since it was withdrawn")
		}
		if s := h[len(h)-1].state; s.Phase != PhaseDiscovered || s.Accepted.Reason != "WaitingForAdmin" {
			return fmt.Errorf("published again as %s, %+v", s.Phase, s.Accepted)
		}
		return nil
	})
}

// A restart does not reopen the door to replays: the newest statement of
// every peer is restored, also of peers that never had a data path.
func TestRestartKeepsRefusingReplays(t *testing.T) {
	net := &network{}
	var mu sync.Mutex
	var fromB [][]byte
	manual := nodeOptions{policy: PolicyManual}
	a, b := newNode(t, net, manual), newNode(t, net, manual)
	net.tap = func(to string, msg []byte) {
		if to == a.id.ClusterID() {
			mu.Lock()
			fromB = append(fromB, msg)
			mu.Unlock()
		}
	}
	meet(a, b)
	inPhase(t, a, b, PhaseDiscovered)
	b.eng.SpecChanged(a.id.ClusterID(), Spec{Networking: NetworkingAccept, Generation: 1}) // b issues a newer one
	within(t, "a accepted b's newer statement", func() error {
		if v := testutil.ToFloat64(a.eng.metrics.accepted); v < 2 {
			return fmt.Errorf("%v accepted", v)
		}
		return nil
	})
	mu.Lock()
	oldest := fromB[0]
	mu.Unlock()
	a.stop()
	a2 := newNode(t, &network{}, nodeOptions{policy: PolicyManual, seed: a})
	<-a2.eng.Ready()
	a2.eng.MemberChanged(b.member(true))
	a2.eng.Receive(oldest)
	refusedOnce(t, "replay refused after the restart", a2, "replayed")
}

// keyWrites counts the ledger's writes of one key.
type keyWrites struct {
	Ledger
	key string
	n   atomic.Int64
}

func (k *keyWrites) PutKey(name string, value []byte) error {
	if name == k.key {
		k.n.Add(1)
	}
	return k.Ledger.PutKey(name, value)
}

// Issuing a statement costs no ledger write (a synced one, on the engine's
// path): the ledger holds a ceiling above the generations issued. They
// still grow across a restart, also when the clock went back meanwhile.
func TestGenerationsGrowWithoutAWriteEach(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	writes := &keyWrites{key: generationKey}
	var mu sync.Mutex
	var issued []uint64
	a := newNode(t, net, nodeOptions{clock: clk, ledger: func(l Ledger) Ledger { writes.Ledger = l; return writes }})
	b, c := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	net.tap = func(to string, msg []byte) {
		if s, err := Parse(msg); err == nil && s.Hello.From == a.id.ClusterID() {
			mu.Lock()
			issued = append(issued, s.Hello.Generation)
			mu.Unlock()
		}
	}
	meet(a, b, c)
	within(t, "connected", func() error {
		if err := connected(a, b); err != nil {
			return err
		}
		return connected(a, c)
	})
	if n, w := testutil.ToFloat64(a.eng.metrics.sent), writes.n.Load(); n < 4 || w != 1 {
		t.Fatalf("%v statements issued, %d writes of the generation; want at least 4 and 1", n, w)
	}

	a.stop()
	clk.Add(-time.Hour)
	mu.Lock()
	before := slices.Max(issued)
	issued = nil
	mu.Unlock()
	a2 := newNode(t, net, nodeOptions{clock: clk, seed: a})
	meet(a2, b)
	// b may still count a as connected from before the restart: wait for
	// a statement of the restarted a too.
	within(t, "b accepts the restarted a's statements", func() error {
		mu.Lock()
		n := len(issued)
		mu.Unlock()
		if n == 0 {
			return errors.New("the restarted a has issued nothing yet")
		}
		return connected(a2, b)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(issued) == 0 || slices.Min(issued) <= before {
		t.Fatalf("after the restart a issued %v, want all above %d", issued, before)
	}
	if v := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("replayed")); v != 0 {
		t.Fatalf("b refused %v of a's statements as replayed", v)
	}
}

// A cluster back under a new identity (its state directory lost) carries
// its old name: once the old identity is gone for good, it is retired, so
// its Peer can go; so is a member gone for good that never said a word
// (the campaign saw a cluster's old identity, gossiped about as it died,
// left as a nameless Peer). A peer gone for good that nobody took the
// place of is only forgotten: its Peer shows it gone.
func TestGonePeersWithoutUseAreRetired(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a := newNode(t, net, nodeOptions{clock: clk})
	b, c := newNode(t, net, nodeOptions{name: "b"}), newNode(t, net, nodeOptions{name: "c"})
	meet(a, b, c)
	within(t, "connected", func() error { return errors.Join(connected(a, b), connected(a, c)) })
	ghost, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	mute := Member{ClusterID: ghost.ClusterID(), PublicKey: ghost.Public(), Alive: true}
	a.eng.MemberChanged(mute) // no engine behind it: it never speaks
	within(t, "the mute member published", func() error {
		if _, ok := a.rec.latest(mute.ClusterID); !ok {
			return errors.New("not yet")
		}
		return nil
	})

	b2 := newNode(t, net, nodeOptions{name: "b"})
	a.eng.MemberChanged(b.member(false))
	a.eng.MemberChanged(c.member(false))
	mute.Alive = false
	a.eng.MemberChanged(mute)
	meet(a, b2)
	within(t, "the new b connected", func() error { return connected(a, b2) })
	clk.Add(2 * time.Minute)
	within(t, "the old b, c and the mute member forgotten", func() error {
		if n := peersKnown(a); n != 1 {
			return fmt.Errorf("a keeps state of %d peers", n)
		}
		return nil
	})
	retired := func(n *node) []event {
		var out []event
		for _, ev := range a.rec.history(n.id.ClusterID()) {
			if ev.retired != "" {
				out = append(out, ev)
			}
		}
		return out
	}
	if got := retired(b); len(got) != 1 {
		t.Errorf("the old b retired %d times, want once", len(got))
	}
	if got := retired(c); len(got) != 0 {
		t.Errorf("c, gone with no successor, retired: %+v", got)
	}
	mutes := 0
	for _, ev := range a.rec.history(mute.ClusterID) {
		if ev.retired != "" {
			mutes++
		}
	}
	if mutes != 1 {
		t.Errorf("the member that never spoke retired %d times, want once", mutes)
	}
	if err := connected(a, b2); err != nil {
		t.Fatalf("the new b after the old one went: %v", err)
	}
}

// A peer retired before a restart stays retired: the restarted engine does
// not publish it again from its ledger, which would recreate its Peer (the
// campaign saw a wiped cluster's old identity come back after another
// cluster's restart). Its statement still refuses replays should it return.
func TestRetiredPeerStaysRetiredAfterARestart(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a := newNode(t, net, nodeOptions{clock: clk})
	b := newNode(t, net, nodeOptions{name: "b"})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	b2 := newNode(t, net, nodeOptions{name: "b"})
	a.eng.MemberChanged(b.member(false))
	meet(a, b2)
	within(t, "the new b connected", func() error { return connected(a, b2) })
	clk.Add(2 * time.Minute)
	within(t, "the old b retired", func() error {
		for _, ev := range a.rec.history(b.id.ClusterID()) {
			if ev.retired != "" {
				return nil
			}
		}
		return errors.New("not yet")
	})
	a.stop()
	net.mu.Lock()
	delete(net.engines, a.id.ClusterID())
	net.mu.Unlock()

	a2 := newNode(t, net, nodeOptions{clock: clk, seed: a})
	meet(a2, b2)
	within(t, "the restarted a connected to the new b", func() error { return connected(a2, b2) })
	if s, ok := a2.rec.latest(b.id.ClusterID()); ok {
		t.Fatalf("the restarted engine published the retired old b again: %s", s.Phase)
	}
}

// failingKeys refuses the writes of one key while fail is set, as a full
// disk refuses the ledger's.
type failingKeys struct {
	Ledger
	key      string
	fail     atomic.Bool
	attempts atomic.Int64 // writes refused
}

func (f *failingKeys) PutKey(name string, value []byte) error {
	if name == f.key && f.fail.Load() {
		f.attempts.Add(1)
		return fmt.Errorf("put key %q: write ledger: %w", name, syscall.ENOSPC)
	}
	return f.Ledger.PutKey(name, value)
}

// A statement that cannot be issued (the ledger's disk full) is logged
// once while it keeps failing, not once per peer and reconcile, and the
// engine says when it issues them again; the peer then hears the news.
func TestStatementsThatCannotBeIssuedAreLoggedOnce(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	var keys *failingKeys
	var log syncbuf.Buffer
	a := newNode(t, net, nodeOptions{clock: clk, logger: slog.New(slog.NewTextHandler(&log, nil)), ledger: func(l Ledger) Ledger {
		keys = &failingKeys{Ledger: l, key: generationKey}
		return keys
	}})
	b := newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })

	keys.fail.Store(true)
	clk.Add(2 * time.Minute) // past the stored ceiling: the next statement needs a write
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Networking: NetworkingDeny, Generation: 2})
	within(t, "the failure logged", func() error {
		if !strings.Contains(log.String(), "cannot issue a new statement") {
			return errors.New("not yet")
		}
		return nil
	})
	// The witness that the engine went past the points where it would log
	// again: more writes refused after the first.
	within(t, "three more refused writes", func() error {
		if n := keys.attempts.Load(); n < 4 {
			return fmt.Errorf("%d attempts", n)
		}
		return nil
	})
	if n := strings.Count(log.String(), "cannot issue a new statement"); n != 1 {
		t.Errorf("the failure logged %d times over %d attempts, want once", n, keys.attempts.Load())
	}
	keys.fail.Store(false)
	within(t, "statements issued again", func() error {
		if !strings.Contains(log.String(), "statements issued again") {
			return errors.New("not yet")
		}
		return nil
	})
	inPhase(t, b, a, PhaseDenied)
}

// refusedRelease refuses to release views while fail is set, as a full
// disk refuses the ledger's writes, and counts the attempts.
type refusedRelease struct {
	Ledger
	fail     atomic.Bool
	attempts atomic.Int64
}

func (r *refusedRelease) Batch(fn func(ipam.Batch) error) error {
	return r.Ledger.Batch(func(b ipam.Batch) error { return fn(releaseBatch{b, r}) })
}

type releaseBatch struct {
	ipam.Batch
	r *refusedRelease
}

func (b releaseBatch) ReleasePeer(peer string) error {
	if b.r.fail.Load() {
		b.r.attempts.Add(1)
		return fmt.Errorf("release peer %s: write ledger: %w", peer, syscall.ENOSPC)
	}
	return b.Batch.ReleasePeer(peer)
}

// Views that cannot be released (the ledger's disk full) are tried again
// every reconcile, but the failure is logged once while it lasts; once
// the disk takes writes again they go to quarantine.
func TestViewsThatCannotBeReleasedAreLoggedOnce(t *testing.T) {
	net := &network{}
	var ledger *refusedRelease
	var log syncbuf.Buffer
	a := newNode(t, net, nodeOptions{logger: slog.New(slog.NewTextHandler(&log, nil)), ledger: func(l Ledger) Ledger {
		ledger = &refusedRelease{Ledger: l}
		return ledger
	}})
	b := newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })

	ledger.fail.Store(true)
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Networking: NetworkingDeny, Generation: 2})
	// The witness that the engine went past the points where it would log
	// again: five attempts refused.
	within(t, "five refused releases", func() error {
		if n := ledger.attempts.Load(); n < 5 {
			return fmt.Errorf("%d attempts", n)
		}
		return nil
	})
	if n := strings.Count(log.String(), "cannot release peer views"); n != 1 {
		t.Errorf("the failure logged %d times over %d attempts, want once:\n%s", n, ledger.attempts.Load(), log.String())
	}
	if len(ledger.Views(b.id.ClusterID())) == 0 {
		t.Fatal("the views went although their release was refused")
	}
	ledger.fail.Store(false)
	within(t, "views released", func() error {
		if v := ledger.Views(b.id.ClusterID()); len(v) > 0 {
			return fmt.Errorf("still held: %v", v)
		}
		if !strings.Contains(log.String(), "views released to quarantine") {
			return errors.New("not logged")
		}
		return nil
	})
}
