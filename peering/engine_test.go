package peering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// fakeDataplane records what the engine asks of the tunnel. The tunnel
// itself is tested against the kernel in tunnel/; here only the
// negotiation is under test.
type fakeDataplane struct {
	key  tunnel.Key
	mu   sync.Mutex
	d    tunnel.Desired
	n    int
	fail error
}

func (f *fakeDataplane) Apply(_ context.Context, d tunnel.Desired) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.d, f.n = d, f.n+1
	return nil
}

func (f *fakeDataplane) setFailing(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *fakeDataplane) Status() ([]tunnel.PeerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []tunnel.PeerStatus
	for _, p := range f.d.Peers {
		out = append(out, tunnel.PeerStatus{ClusterID: p.ClusterID, PublicKey: p.PublicKey, LastHandshake: time.Now()})
	}
	return out, nil
}

func (f *fakeDataplane) PublicKey() tunnel.Key { return f.key.PublicKey() }

func (f *fakeDataplane) desired() (tunnel.Desired, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.d, f.n
}

func (f *fakeDataplane) peer(id string) (tunnel.Peer, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.d.Peers, func(p tunnel.Peer) bool { return p.ClusterID == id })
	if i < 0 {
		return tunnel.Peer{}, false
	}
	return f.d.Peers[i], true
}

// network delivers messages between engines in memory, like the gossip
// transport does between processes.
type network struct {
	mu      sync.Mutex
	engines map[string]*Engine
	// tap sees every message sent.
	tap func(to string, msg []byte)
}

type transport struct {
	net  *network
	from string
}

func (t transport) Send(_ context.Context, to string, msg []byte) error {
	t.net.mu.Lock()
	e, ok := t.net.engines[to]
	tap := t.net.tap
	t.net.mu.Unlock()
	if tap != nil {
		tap(to, msg)
	}
	if !ok {
		return fmt.Errorf("no route to %s", to)
	}
	e.Receive(msg)
	return nil
}

type node struct {
	id     identity.Identity
	ledger *ipam.Ledger
	dp     *fakeDataplane
	eng    *Engine
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
	path   string
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var pods = netip.MustParsePrefix("10.0.0.0/16")

// statuses, when set before newNode, receives the nodes' Peer statuses.
var statuses StatusWriter

func newNode(t *testing.T, net *network, policy Policy, clk *clock, seed *node) *node {
	t.Helper()
	n := &node{dp: &fakeDataplane{}}
	if seed != nil { // a restart: same identity, ledger and keys
		n.id, n.path, n.dp.key = seed.id, seed.path, seed.dp.key
	} else {
		var err error
		if n.id, err = identity.Generate(); err != nil {
			t.Fatal(err)
		}
		n.path = filepath.Join(t.TempDir(), ipam.FileName)
		n.dp.key, _ = tunnel.GeneratePrivateKey()
	}
	l, err := ipam.Open(n.path, ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n.ledger = l
	if _, err := l.SetLocalNetworks([]ipam.LocalNetwork{{Range: pods, Kind: ipam.PodNetwork}}); err != nil {
		t.Fatal(err)
	}
	n.reg = prometheus.NewRegistry()
	cfg := Config{
		Identity: n.id, Name: "cluster-" + n.id.ClusterID()[:6], Policy: policy,
		Networks: []netip.Prefix{pods}, Endpoint: netip.MustParseAddrPort("198.18.1.1:51820"),
		Ledger: l, Dataplane: n.dp, Transport: transport{net: net, from: n.id.ClusterID()},
		ResendInterval: 200 * time.Millisecond, UnreachableGrace: time.Minute, Metrics: n.reg,
		Logger: slog.New(slog.DiscardHandler),
	}
	if clk != nil {
		cfg.Now = clk.Now
	}
	if statuses != nil {
		cfg.Status = statuses
	}
	n.eng, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	if net.engines == nil {
		net.engines = map[string]*Engine{}
	}
	net.engines[n.id.ClusterID()] = n.eng
	net.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	go func() { defer close(n.done); n.eng.Run(ctx) }()
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	n.cancel()
	<-n.done
	n.ledger.Close()
}

// meet makes every node a live member for every other.
func meet(nodes ...*node) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.eng.MemberChanged(Member{ClusterID: b.id.ClusterID(), PublicKey: b.id.Public(), Alive: true})
			}
		}
	}
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connected checks that a and b configured each other consistently: what a
// routes as its view of b is what b says a sees it as, both ways.
func connected(a, b *node) error {
	ap, ok := a.dp.peer(b.id.ClusterID())
	if !ok {
		return fmt.Errorf("%s has no tunnel peer for %s", a.id.ClusterID()[:6], b.id.ClusterID()[:6])
	}
	bp, ok := b.dp.peer(a.id.ClusterID())
	if !ok {
		return fmt.Errorf("%s has no tunnel peer for %s", b.id.ClusterID()[:6], a.id.ClusterID()[:6])
	}
	if ap.PublicKey != b.dp.PublicKey() || bp.PublicKey != a.dp.PublicKey() {
		return errors.New("WireGuard keys do not match")
	}
	if len(ap.Views) != 1 || len(bp.ViewsOfMe) != 1 || ap.Views[0] != bp.ViewsOfMe[0] {
		return fmt.Errorf("a's views of b %v do not mirror b's record of them %v", ap.Views, bp.ViewsOfMe)
	}
	if len(bp.Views) != 1 || len(ap.ViewsOfMe) != 1 || bp.Views[0] != ap.ViewsOfMe[0] {
		return fmt.Errorf("b's views of a %v do not mirror a's record of them %v", bp.Views, ap.ViewsOfMe)
	}
	return nil
}

func phaseOf(n *node, peer *node) v1alpha1.Phase {
	for _, s := range n.eng.Snapshot() {
		if s.ClusterID == peer.id.ClusterID() {
			return s.Phase
		}
	}
	return ""
}

// Three clusters with the same PodCIDR: every pair agrees, and every
// cluster's views of its peers are disjoint and remapped.
func TestNegotiationConverges(t *testing.T) {
	net := &network{}
	a, b, c := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b, c)
	for _, pair := range [][2]*node{{a, b}, {a, c}, {b, c}} {
		eventually(t, "pair connected", func() error { return connected(pair[0], pair[1]) })
	}
	for _, n := range []*node{a, b, c} {
		var views []netip.Prefix
		d, _ := n.dp.desired()
		for _, p := range d.Peers {
			if p.Views[0].As == pods {
				t.Errorf("view of an overlapping PodCIDR was not remapped: %v", p.Views)
			}
			for _, v := range views {
				if v.Overlaps(p.Views[0].As) {
					t.Errorf("views %s and %s overlap", v, p.Views[0].As)
				}
			}
			views = append(views, p.Views[0].As)
		}
		eventually(t, "phase Connected", func() error {
			for _, s := range n.eng.Snapshot() {
				if s.Phase != v1alpha1.PhaseConnected {
					return fmt.Errorf("%s is %s", s.ClusterID, s.Phase)
				}
			}
			return nil
		})
	}
	// Settled: resends carry no new generation.
	issued := testutil.ToFloat64(a.eng.metrics.sent)
	time.Sleep(600 * time.Millisecond)
	if now := testutil.ToFloat64(a.eng.metrics.sent); now != issued {
		t.Errorf("a issued %v new statements after settling", now-issued)
	}
}

func TestManualPolicyWaitsForBothSides(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, PolicyManual, nil, nil), newNode(t, net, PolicyManual, nil, nil)
	meet(a, b)
	eventually(t, "statements exchanged", func() error {
		if phaseOf(a, b) != v1alpha1.PhaseDiscovered || phaseOf(b, a) != v1alpha1.PhaseDiscovered {
			return fmt.Errorf("phases %s/%s", phaseOf(a, b), phaseOf(b, a))
		}
		return nil
	})
	a.eng.SpecChanged(b.id.ClusterID(), v1alpha1.NetworkingAccept, true)
	time.Sleep(500 * time.Millisecond) // several resend rounds
	if _, ok := a.dp.peer(b.id.ClusterID()); ok {
		t.Fatal("a configured a tunnel that b has not accepted")
	}
	if len(a.ledger.Views("")) != 0 {
		t.Fatal("a allocated a view before both sides accepted")
	}
	b.eng.SpecChanged(a.id.ClusterID(), v1alpha1.NetworkingAccept, true)
	eventually(t, "connected after both accepted", func() error { return connected(a, b) })
}

// Deny on one side tears down both sides and quarantines both views;
// deleting the Peer object resets and reconnects under auto.
func TestDenyAndResetTearDownBothSides(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b)
	eventually(t, "connected", func() error { return connected(a, b) })
	a.eng.SpecChanged(b.id.ClusterID(), v1alpha1.NetworkingDeny, true)
	eventually(t, "both sides torn down", func() error {
		_, ina := a.dp.peer(b.id.ClusterID())
		_, inb := b.dp.peer(a.id.ClusterID())
		if ina || inb {
			return fmt.Errorf("tunnel peers left: a=%v b=%v", ina, inb)
		}
		if len(a.ledger.Quarantine()) == 0 || len(b.ledger.Quarantine()) == 0 {
			return errors.New("views not quarantined on both sides")
		}
		return nil
	})
	if phaseOf(a, b) != v1alpha1.PhaseDenied || phaseOf(b, a) != v1alpha1.PhaseDenied {
		t.Fatalf("phases after deny: %s/%s, want Denied", phaseOf(a, b), phaseOf(b, a))
	}
	a.eng.SpecChanged(b.id.ClusterID(), "", true)
	eventually(t, "reconnected after the deny was lifted", func() error { return connected(a, b) })

	a.eng.SpecChanged(b.id.ClusterID(), "", false) // the admin deletes the Peer
	eventually(t, "b tore down after a's reset", func() error {
		if _, ok := b.dp.peer(a.id.ClusterID()); ok {
			return errors.New("b still has a tunnel to a")
		}
		return nil
	})
	eventually(t, "reconnected after the reset", func() error { return connected(a, b) })
}

// Refusals: replayed and forged statements change nothing.
func TestRefusesReplaysAndForgeries(t *testing.T) {
	net := &network{}
	var mu sync.Mutex
	var fromA [][]byte
	a, b := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	net.tap = func(to string, msg []byte) {
		if to == b.id.ClusterID() {
			mu.Lock()
			fromA = append(fromA, msg)
			mu.Unlock()
		}
	}
	meet(a, b)
	eventually(t, "connected", func() error { return connected(a, b) })
	before, _ := b.dp.peer(a.id.ClusterID())
	_, applies := b.dp.desired()

	mu.Lock()
	oldest := fromA[0]
	mu.Unlock()
	b.eng.Receive(oldest)
	eventually(t, "replay refused", func() error {
		if v := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("replayed")); v != 1 {
			return fmt.Errorf("replayed refusals %v", v)
		}
		return nil
	})

	// Mallory, not a member, speaks (her message waits for a member event
	// that never comes); then she signs a statement claiming to be a.
	mallory, _ := identity.Generate()
	h := &Hello{Protocol: ProtocolVersion, From: mallory.ClusterID(), To: b.id.ClusterID(), Generation: 1 << 62,
		Networks: []netip.Prefix{pods}, WireGuardKey: make([]byte, 32), Endpoint: netip.MustParseAddrPort("198.18.9.9:51820"), Decision: Accept}
	msg, err := Seal(h, mallory)
	if err != nil {
		t.Fatal(err)
	}
	b.eng.Receive(msg)
	h.From = a.id.ClusterID()
	payload, _ := jsonMarshal(h)
	b.eng.Receive(reseal(payload, mallory))
	eventually(t, "forgery refused", func() error {
		if v := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("forged")); v != 1 {
			return fmt.Errorf("forged refusals %v", v)
		}
		return nil
	})
	after, _ := b.dp.peer(a.id.ClusterID())
	if _, n := b.dp.desired(); after.Endpoint != before.Endpoint || n != applies {
		t.Fatalf("a refused message changed b's data path: %v -> %v (%d applies, was %d)", before.Endpoint, after.Endpoint, n, applies)
	}
	if len(b.eng.Snapshot()) != 1 {
		t.Fatalf("b knows %d peers, want 1 (mallory must not appear)", len(b.eng.Snapshot()))
	}
}

// A member that fails keeps its tunnel for the grace period, then loses
// tunnel and view.
func TestUnreachableGracePeriod(t *testing.T) {
	net := &network{}
	clk := &clock{t: time.Now()}
	a, b := newNode(t, net, PolicyAuto, clk, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b)
	eventually(t, "connected", func() error { return connected(a, b) })
	a.eng.MemberChanged(Member{ClusterID: b.id.ClusterID(), PublicKey: b.id.Public(), Alive: false})
	eventually(t, "unreachable", func() error {
		if p := phaseOf(a, b); p != v1alpha1.PhaseUnreachable {
			return fmt.Errorf("phase %s", p)
		}
		return nil
	})
	if _, ok := a.dp.peer(b.id.ClusterID()); !ok {
		t.Fatal("tunnel removed before the grace period ended")
	}
	clk.Add(2 * time.Minute)
	eventually(t, "tunnel removed after the grace period", func() error {
		if _, ok := a.dp.peer(b.id.ClusterID()); ok {
			return errors.New("still configured")
		}
		if len(a.ledger.Quarantine()) != 1 {
			return fmt.Errorf("%d views in quarantine, want 1", len(a.ledger.Quarantine()))
		}
		return nil
	})
}

// A restarted engine configures the data path from its ledger before any
// member is heard from, so a restart does not drop traffic.
func TestRestartRestoresDataPathFromLedger(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b)
	eventually(t, "connected", func() error { return connected(a, b) })
	before, _ := a.dp.peer(b.id.ClusterID())
	a.stop()
	net.mu.Lock()
	delete(net.engines, a.id.ClusterID())
	net.mu.Unlock()

	a2 := newNode(t, &network{}, PolicyAuto, nil, a) // hears nobody
	<-a2.eng.Ready()
	got, ok := a2.dp.peer(b.id.ClusterID())
	if !ok {
		t.Fatal("restarted agent did not restore the tunnel peer")
	}
	if got.Views[0] != before.Views[0] || got.ViewsOfMe[0] != before.ViewsOfMe[0] || got.PublicKey != before.PublicKey {
		t.Fatalf("restored %+v, had %+v", got, before)
	}
}

// A statement that overtakes its sender's join event is not lost: it is
// processed when the member appears.
func TestMessageBeforeMemberEvent(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	// Only a learns of b: a's hello reaches b, which does not know a yet.
	a.eng.MemberChanged(Member{ClusterID: b.id.ClusterID(), PublicKey: b.id.Public(), Alive: true})
	time.Sleep(100 * time.Millisecond)
	if got := testutil.ToFloat64(b.eng.metrics.accepted); got != 0 {
		t.Fatalf("b accepted %v statements from an unknown sender", got)
	}
	b.eng.MemberChanged(Member{ClusterID: a.id.ClusterID(), PublicKey: a.id.Public(), Alive: true})
	eventually(t, "connected", func() error { return connected(a, b) })
	if v := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("forged")); v != 0 {
		t.Fatalf("an early genuine statement was counted as forged (%v)", v)
	}
}

// A data path that fails to apply is reported, not hidden behind an old
// handshake.
func TestApplyFailureIsDegraded(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b)
	eventually(t, "connected", func() error { return connected(a, b) })
	// From now on b's kernel refuses; a third cluster gives b something
	// new to apply.
	b.dp.setFailing(errors.New("nftables: operation not permitted"))
	c := newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b, c)
	eventually(t, "b's Peer of a degraded", func() error {
		for _, s := range b.eng.Snapshot() {
			if s.ClusterID != a.id.ClusterID() {
				continue
			}
			for _, cond := range s.Status.Conditions {
				if cond.Type == v1alpha1.ConditionTunnelUp && cond.Reason == "ApplyFailed" && s.Phase == v1alpha1.PhaseDegraded {
					return nil
				}
			}
			return fmt.Errorf("phase %s, conditions %+v", s.Phase, s.Status.Conditions)
		}
		return errors.New("no Peer of a")
	})
}

// A member announcing another's WireGuard key (it is public) is left out
// of the data path alone: the established peer stays connected, and the
// newcomer's Peer says why.
func TestCopiedKeyIsLeftOutAlone(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b)
	eventually(t, "connected", func() error { return connected(a, b) })
	copycat, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	seed := &node{id: copycat, path: filepath.Join(t.TempDir(), ipam.FileName), dp: &fakeDataplane{key: b.dp.key}}
	c := newNode(t, net, PolicyAuto, nil, seed)
	meet(a, b, c)
	eventually(t, "a refuses c's tunnel, keeps b's", func() error {
		for _, s := range a.eng.Snapshot() {
			if s.ClusterID != c.id.ClusterID() {
				continue
			}
			if s.Phase != v1alpha1.PhaseDegraded {
				return fmt.Errorf("c is %s", s.Phase)
			}
			for _, cond := range s.Status.Conditions {
				if cond.Type == v1alpha1.ConditionTunnelUp && cond.Reason == "Refused" && strings.Contains(cond.Message, "public key") {
					return nil
				}
			}
			return fmt.Errorf("c's conditions: %+v", s.Status.Conditions)
		}
		return errors.New("a has no Peer for c")
	})
	if err := connected(a, b); err != nil {
		t.Fatalf("the copycat broke a and b: %v", err)
	}
	if _, ok := a.dp.peer(c.id.ClusterID()); ok {
		t.Fatal("a configured the copycat")
	}
}

// recordingStatus counts the Peer objects written, like the API would
// receive them.
type recordingStatus struct {
	mu     sync.Mutex
	writes map[string]int
}

func (r *recordingStatus) Write(_ context.Context, id, _ string, _ v1alpha1.PeerStatus) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes[id]++
	return nil
}

func (r *recordingStatus) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes[id]
}

// A deleted Peer comes back per policy even when nothing about the peer
// changed (manual policy, both sides pending): the admin needs an object
// to accept.
func TestDeletedPeerIsRecreated(t *testing.T) {
	rec := &recordingStatus{writes: map[string]int{}}
	statuses = rec
	defer func() { statuses = nil }()
	net := &network{}
	a, b := newNode(t, net, PolicyManual, nil, nil), newNode(t, net, PolicyManual, nil, nil)
	meet(a, b)
	id := b.id.ClusterID()
	eventually(t, "b's Peer written on a", func() error {
		if phaseOf(a, b) != v1alpha1.PhaseDiscovered || rec.count(id) == 0 {
			return fmt.Errorf("phase %s, %d writes", phaseOf(a, b), rec.count(id))
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // settled: nothing new to write
	before := rec.count(id)
	a.eng.SpecChanged(id, "", false)
	eventually(t, "b's Peer recreated after the reset", func() error {
		if rec.count(id) <= before {
			return fmt.Errorf("%d writes, had %d", rec.count(id), before)
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
	a, b := newNode(t, net, PolicyManual, nil, nil), newNode(t, net, PolicyManual, nil, nil)
	net.tap = func(to string, msg []byte) {
		if to == a.id.ClusterID() {
			mu.Lock()
			fromB = append(fromB, msg)
			mu.Unlock()
		}
	}
	meet(a, b)
	eventually(t, "b's first statement", func() error {
		if phaseOf(a, b) != v1alpha1.PhaseDiscovered {
			return fmt.Errorf("phase %s", phaseOf(a, b))
		}
		return nil
	})
	b.eng.SpecChanged(a.id.ClusterID(), v1alpha1.NetworkingAccept, true) // b issues a newer one
	eventually(t, "a accepted b's newer statement", func() error {
		if v := testutil.ToFloat64(a.eng.metrics.accepted); v < 2 {
			return fmt.Errorf("%v accepted", v)
		}
		return nil
	})
	mu.Lock()
	oldest := fromB[0]
	mu.Unlock()
	a.stop()
	a2 := newNode(t, &network{}, PolicyManual, nil, a)
	<-a2.eng.Ready()
	a2.eng.MemberChanged(Member{ClusterID: b.id.ClusterID(), PublicKey: b.id.Public(), Alive: true})
	a2.eng.Receive(oldest)
	eventually(t, "replay refused after the restart", func() error {
		if v := testutil.ToFloat64(a2.eng.metrics.refused.WithLabelValues("replayed")); v != 1 {
			return fmt.Errorf("replayed refusals %v", v)
		}
		return nil
	})
}

// Once settled, a federation sends only its periodic resends: a received
// duplicate must not set off more messages (it once did: every reconcile
// resent to every peer, ~19,000 messages in 2 s here instead of 60).
func TestSettledFederationOnlyResends(t *testing.T) {
	net := &network{}
	var sent atomic.Int64
	net.tap = func(string, []byte) { sent.Add(1) }
	a, b, c := newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil), newNode(t, net, PolicyAuto, nil, nil)
	meet(a, b, c)
	for _, pair := range [][2]*node{{a, b}, {a, c}, {b, c}} {
		eventually(t, "connected", func() error { return connected(pair[0], pair[1]) })
	}
	time.Sleep(500 * time.Millisecond)
	const window = 2 * time.Second
	before := sent.Load()
	time.Sleep(window)
	// 6 directed pairs, one resend per 200 ms interval each: 60.
	rounds := int64(window / (200 * time.Millisecond))
	if got, limit := sent.Load()-before, 2*6*rounds; got > limit {
		t.Fatalf("%d messages in %s while settled, want at most %d (%d resend rounds)", got, window, limit, rounds)
	}
}
