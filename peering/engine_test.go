package peering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// fakeDataplane records what the engine asks of the tunnel. The tunnel
// itself is tested against the kernel in tunnel/; here only the
// negotiation is under test. It reports a handshake or traffic only when
// a test says there was one.
type fakeDataplane struct {
	key        tunnel.Key
	mu         sync.Mutex
	d          tunnel.Desired
	n          int
	fail       error
	handshakes map[string]time.Time
	bytes      map[string][2]int64
	removed    map[string]int
	// wire, when set, reports handshakes as WireGuard would make them:
	// once both sides hold each other (benchmarks).
	wire *wire

	pubOnce sync.Once
	pub     tunnel.Key
}

func (f *fakeDataplane) Apply(_ context.Context, d tunnel.Desired) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	for _, p := range f.d.Peers {
		if !slices.ContainsFunc(d.Peers, func(q tunnel.Peer) bool { return q.ClusterID == p.ClusterID }) {
			if f.removed == nil {
				f.removed = map[string]int{}
			}
			f.removed[p.ClusterID]++
		}
	}
	f.d, f.n = d, f.n+1
	if f.wire != nil {
		f.wire.applied(f.PublicKey(), d)
	}
	return nil
}

// removals is how often a tunnel peer left the data path.
func (f *fakeDataplane) removals(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removed[id]
}

func (f *fakeDataplane) setFailing(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

// handshake reports a WireGuard handshake with peer at t.
func (f *fakeDataplane) handshake(peer string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.handshakes == nil {
		f.handshakes = map[string]time.Time{}
	}
	f.handshakes[peer] = t
}

// traffic reports the byte counters of the tunnel to peer.
func (f *fakeDataplane) traffic(peer string, rx, tx int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bytes == nil {
		f.bytes = map[string][2]int64{}
	}
	f.bytes[peer] = [2]int64{rx, tx}
}

func (f *fakeDataplane) Status() ([]tunnel.PeerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []tunnel.PeerStatus
	for _, p := range f.d.Peers {
		b := f.bytes[p.ClusterID]
		hs := f.handshakes[p.ClusterID]
		if f.wire != nil {
			hs = f.wire.handshake(f.PublicKey(), p.PublicKey)
		}
		out = append(out, tunnel.PeerStatus{ClusterID: p.ClusterID, PublicKey: p.PublicKey,
			LastHandshake: hs, RxBytes: b[0], TxBytes: b[1]})
	}
	return out, nil
}

// PublicKey is derived once, as the tunnel holds it: the engine asks for
// it on every statement it considers.
func (f *fakeDataplane) PublicKey() tunnel.Key {
	f.pubOnce.Do(func() { f.pub = f.key.PublicKey() })
	return f.pub
}

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
	// rewrite, when set, changes every message on its way out.
	rewrite func(msg []byte) []byte
}

func (t transport) Send(_ context.Context, to string, msg []byte) error {
	if t.rewrite != nil {
		msg = t.rewrite(msg)
	}
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

// recorder is the Publisher of a test node: it keeps every state and
// withdrawal in order, as peerapi would receive them.
type recorder struct {
	mu     sync.Mutex
	events []event
	// seen, when set, is called with every state published (benchmarks).
	seen func(PeerState)
}

type event struct {
	state    PeerState
	withdraw string
	retired  string
}

func (r *recorder) Publish(s PeerState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{state: s})
	if r.seen != nil {
		r.seen(s)
	}
}

func (r *recorder) Withdraw(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{withdraw: id})
}

func (r *recorder) Retire(id, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{retired: id})
}

// latest returns the last state published for id.
func (r *recorder) latest(id string) (PeerState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if r.events[i].state.ClusterID == id {
			return r.events[i].state, true
		}
	}
	return PeerState{}, false
}

// history returns the events about id.
func (r *recorder) history(id string) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for _, ev := range r.events {
		if ev.state.ClusterID == id || ev.withdraw == id || ev.retired == id {
			out = append(out, ev)
		}
	}
	return out
}

type node struct {
	id     identity.Identity
	ledger *ipam.Ledger
	dp     *fakeDataplane
	rec    *recorder
	eng    *Engine
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
	path   string
	// outboundOnly: the node is behind NAT (its member record says so).
	outboundOnly bool

	stopOnce sync.Once
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

// nodeOptions vary a test node; the zero value is an auto-policy node on
// the real clock.
type nodeOptions struct {
	policy Policy
	clock  *clock
	// seed restarts a node: same identity, ledger and keys.
	seed *node
	// rewrite changes the node's messages on their way out.
	rewrite func(from identity.Identity, msg []byte) []byte
	// ledger, when set, stands between the engine and its ledger.
	ledger func(Ledger) Ledger
	// networks are the node's announced ranges (default: pods); locals
	// its local networks in the ledger (default: networks).
	networks, locals []netip.Prefix
	// logger, when set, receives the engine's log.
	logger *slog.Logger
	// grants, when set, receives the grants peers send.
	grants GrantReceiver
	// labels are the node's cluster labels.
	labels map[string]string
	// resend is the engine's ResendInterval (default 200 ms).
	resend time.Duration
	// wire, when set, makes the node's handshakes (benchmarks).
	wire *wire
	// dataplane, when set, stands between the engine and its data plane.
	dataplane func(Dataplane) Dataplane
	// name is the node's cluster name (default: from its identity).
	name string
	// endpoint is the node's WireGuard endpoint (default 198.18.1.1:51820).
	endpoint netip.AddrPort
	// outboundOnly: the node is behind NAT.
	outboundOnly bool
}

func newNode(t testing.TB, net *network, o nodeOptions) *node {
	t.Helper()
	n := &node{dp: &fakeDataplane{wire: o.wire}, rec: &recorder{}, outboundOnly: o.outboundOnly}
	if o.seed != nil {
		n.id, n.path, n.dp.key = o.seed.id, o.seed.path, o.seed.dp.key
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
	networks := o.networks
	if networks == nil {
		networks = []netip.Prefix{pods}
	}
	var locals []ipam.LocalNetwork
	if o.locals == nil {
		o.locals = networks
	}
	for _, p := range o.locals {
		locals = append(locals, ipam.LocalNetwork{Range: p, Kind: ipam.PodNetwork})
	}
	if _, err := l.SetLocalNetworks(locals); err != nil {
		t.Fatal(err)
	}
	n.reg = prometheus.NewRegistry()
	tr := transport{net: net, from: n.id.ClusterID()}
	if o.rewrite != nil {
		tr.rewrite = func(msg []byte) []byte { return o.rewrite(n.id, msg) }
	}
	var led Ledger = l
	if o.ledger != nil {
		led = o.ledger(l)
	}
	var dp Dataplane = n.dp
	if o.dataplane != nil {
		dp = o.dataplane(n.dp)
	}
	name := o.name
	if name == "" {
		name = "cluster-" + n.id.ClusterID()[:6]
	}
	endpoint := o.endpoint
	if !endpoint.IsValid() {
		endpoint = netip.MustParseAddrPort("198.18.1.1:51820")
	}
	cfg := Config{
		Identity: n.id, Name: name, Labels: o.labels, Policy: o.policy,
		Networks: networks, Endpoint: endpoint, OutboundOnly: o.outboundOnly,
		Ledger: led, Dataplane: dp, Transport: tr, Publisher: n.rec,
		ResendInterval: 200 * time.Millisecond, UnreachableGrace: time.Minute, Metrics: n.reg,
		Logger: slog.New(slog.DiscardHandler),
	}
	if o.logger != nil {
		cfg.Logger = o.logger
	}
	if o.resend != 0 {
		cfg.ResendInterval = o.resend
	}
	cfg.Grants = o.grants
	if o.clock != nil {
		cfg.Now = o.clock.Now
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
	n.stopOnce.Do(func() { n.ledger.Close() })
}

func (n *node) member(alive bool) Member {
	return Member{ClusterID: n.id.ClusterID(), PublicKey: n.id.Public(), Alive: alive, OutboundOnly: n.outboundOnly}
}

// meet makes every node a live member for every other.
func meet(nodes ...*node) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.eng.MemberChanged(b.member(true))
			}
		}
	}
}

// within waits for cond, which says what it sees instead while it fails.
func within(t *testing.T, what string, cond func() error) {
	t.Helper()
	eventually.Within(t, 10*time.Second, what, cond)
}

// refusedOnce waits until n has refused exactly one message for reason.
func refusedOnce(t *testing.T, what string, n *node, reason string) {
	t.Helper()
	within(t, what, func() error {
		if v := testutil.ToFloat64(n.eng.metrics.refused.WithLabelValues(reason)); v != 1 {
			return fmt.Errorf("%s refusals %v", reason, v)
		}
		return nil
	})
}

// connected checks that a and b configured each other consistently: what a
// routes as its view of b is what b says a sees it as, both ways; and that
// the exchange settled: each heard that the other's data path holds it.
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
	if ap.FirstContact == tunnel.FirstContactAnnounced || bp.FirstContact == tunnel.FirstContactAnnounced {
		return errors.New("not yet told that the other's data path holds it")
	}
	return nil
}

// stateOf returns what n last published about peer.
func stateOf(n, peer *node) PeerState {
	s, _ := n.rec.latest(peer.id.ClusterID())
	return s
}

// inPhase waits until n's state of peer is in phase ph.
func inPhase(t *testing.T, n, peer *node, ph Phase) PeerState {
	t.Helper()
	var s PeerState
	within(t, fmt.Sprintf("%s's peer %s %s", n.id.ClusterID()[:6], peer.id.ClusterID()[:6], ph), func() error {
		if s = stateOf(n, peer); s.Phase != ph {
			return fmt.Errorf("phase %q, conditions %+v %+v %+v %+v", s.Phase, s.Member, s.Accepted, s.ViewsAgreed, s.TunnelUp)
		}
		return nil
	})
	return s
}

// peersKnown is what flotilla_peers says: how many peers n keeps state of.
func peersKnown(n *node) int {
	total := 0.0
	for _, ph := range Phases {
		total += testutil.ToFloat64(n.eng.metrics.peers.WithLabelValues(string(ph)))
	}
	return int(total)
}
