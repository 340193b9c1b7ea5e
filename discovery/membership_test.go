package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/identity"
)

var testKey = bytes.Repeat([]byte{0x42}, 32)

type nodeOpts struct {
	id    *identity.Identity
	keys  [][]byte
	seeds []string
	bind  string // default 127.0.0.1:0
	// advertise is Config.AdvertiseAddr; default the bound address.
	advertise    string
	outboundOnly bool
	endpoint     string
	domains      []string
	dns          string
	// onMessage is Config.OnMessage.
	onMessage func([]byte)
	// onServices is Config.OnServices.
	onServices func([]byte)
	serials    SerialStore
	now        func() time.Time
	// tune adjusts the memberlist configuration after fastTimings.
	tune func(*memberlist.Config)
	// settle, when set, is how long after a join its follow-up comes.
	settle time.Duration
}

type testNode struct {
	d   *Discovery
	reg *prometheus.Registry
	id  identity.Identity
}

func (n *testNode) addr() string { return n.d.ml.LocalNode().Address() }

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("DISCOVERY_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

// fastTimings shortens memberlist's loopback timings so tests finish
// quickly; behaviour is the same as the LAN profile's.
func fastTimings(c *memberlist.Config) {
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.PushPullInterval = 2 * time.Second
	c.TCPTimeout = time.Second
}

// testProtocol stands for the peering protocol version the agent passes.
const testProtocol = 3

func startNode(t testing.TB, o nodeOpts) *testNode {
	t.Helper()
	id := mustIdentity(t)
	if o.id != nil {
		id = *o.id
	}
	if o.keys == nil {
		o.keys = [][]byte{testKey}
	}
	if o.bind == "" {
		o.bind = "127.0.0.1:0"
	}
	var advertise netip.AddrPort
	if o.advertise != "" {
		advertise = netip.MustParseAddrPort(o.advertise)
	}
	reg := prometheus.NewRegistry()
	d, err := New(Config{
		AdvertiseAddr:   advertise,
		OutboundOnly:    o.outboundOnly,
		Identity:        id,
		Protocol:        testProtocol,
		Keys:            o.keys,
		BindAddr:        netip.MustParseAddrPort(o.bind),
		Endpoint:        o.endpoint,
		Seeds:           o.seeds,
		DNSDomains:      o.domains,
		DNSServer:       o.dns,
		ResolveInterval: time.Second,
		RetryMin:        100 * time.Millisecond,
		RetryMax:        time.Second,
		Profile:         ProfileLocal,
		Tune: func(c *memberlist.Config) {
			fastTimings(c)
			if o.tune != nil {
				o.tune(c)
			}
		},
		OnMessage:  o.onMessage,
		OnServices: o.onServices,
		Serials:    o.serials,
		Now:        o.now,
		Logger:     testLogger(t),
		Metrics:    reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.settle > 0 {
		d.cands.settle = o.settle
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := &testNode{d: d, reg: reg, id: id}
	t.Cleanup(func() { _ = d.Close() })
	return n
}

// waitUntil is eventually.Within for this package's tests, whose
// conditions say themselves what they wait for.
func waitUntil(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	eventually.Within(t, within, "condition", cond)
}

func sees(n *testNode, others ...*testNode) error {
	alive := n.d.Alive()
	for _, o := range others {
		if !slices.Contains(alive, o.id.ClusterID()) {
			return fmt.Errorf("%s sees %v, not %s", n.id.ClusterID(), alive, o.id.ClusterID())
		}
	}
	return nil
}

// metricValue returns the value of the metric family name whose labels
// include labels ("k=v" pairs).
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, want := range labels {
				k, v, _ := strings.Cut(want, "=")
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// nextEvent waits for the next event of member id.
func nextEvent(t testing.TB, ch <-chan Event, id string, within time.Duration) Event {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event stream closed while waiting for %s", id)
			}
			if ev.Member.ClusterID == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("no event for %s within %s", id, within)
		}
	}
}

func TestSeedsFormFullMembership(t *testing.T) {
	a := startNode(t, nodeOpts{endpoint: "192.0.2.1:51820"})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}, endpoint: "192.0.2.2:51820"})
	c := startNode(t, nodeOpts{seeds: []string{b.addr()}})
	all := []*testNode{a, b, c}
	for _, n := range all {
		waitUntil(t, 20*time.Second, func() error {
			var others []*testNode
			for _, o := range all {
				if o != n {
					others = append(others, o)
				}
			}
			return sees(n, others...)
		})
	}
	// The verified record travels with the member.
	snap := c.d.Snapshot()
	var gotA *Member
	for i := range snap.Members {
		if snap.Members[i].ClusterID == a.id.ClusterID() {
			gotA = &snap.Members[i]
		}
	}
	if gotA == nil || gotA.Record.Endpoint != "192.0.2.1:51820" || !bytes.Equal(gotA.Record.PublicKey, a.id.Public()) {
		t.Fatalf("c's view of a: %+v", gotA)
	}
	if gotA.Gossip.String() != a.addr() {
		t.Errorf("gossip address %s, want %s", gotA.Gossip, a.addr())
	}
	if got := metricValue(t, c.reg, "flotilla_discovery_members", "state=alive"); got != 2 {
		t.Errorf("members{state=alive} = %v, want 2", got)
	}
}

// A newcomer that learned of a member through another one still exchanges
// state with it when it answers as a candidate (an mDNS answer arriving
// after the first join): the member learns of the newcomer at once, not
// when gossip brings the newcomer's alive message. Gossip, probes and
// periodic exchanges are off here, so a direct exchange is the only way
// anyone learns of anyone.
func TestNewCandidateThatIsAMemberLearnsOfUsDirectly(t *testing.T) {
	quiet := func(c *memberlist.Config) { c.GossipInterval, c.ProbeInterval, c.PushPullInterval = 0, 0, 0 }
	a := startNode(t, nodeOpts{tune: quiet})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}, tune: quiet})
	t.Cleanup(a.d.kill) // a Leave would wait for gossip that is off
	t.Cleanup(b.d.kill)
	// b's join and its follow-up are over: b learns nothing more from a.
	waitUntil(t, 10*time.Second, func() error {
		if n := metricValue(t, b.reg, "flotilla_discovery_joins_total"); n < 2 {
			return fmt.Errorf("b made %v exchanges with a, want the join and its follow-up", n)
		}
		return nil
	})
	c := startNode(t, nodeOpts{seeds: []string{a.addr()}, tune: quiet})
	t.Cleanup(c.d.kill)
	waitUntil(t, 10*time.Second, func() error { return errors.Join(sees(a, b, c), sees(c, a, b)) })
	c.d.cands.add(b.addr(), SourceMDNS, time.Minute)
	waitUntil(t, 10*time.Second, func() error { return sees(b, c) })
}

func TestSubscribeStartsWithAliveMembersAndFollowsUpdates(t *testing.T) {
	a := startNode(t, nodeOpts{})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := a.d.Subscribe(ctx)
	if ev := nextEvent(t, events, b.id.ClusterID(), 5*time.Second); ev.Kind != Join || ev.Member.State != StateAlive {
		t.Fatalf("first event %v %s, want join of an alive member", ev.Kind, ev.Member.State)
	}
	if err := b.d.SetEndpoint("198.51.100.9:51820"); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events, b.id.ClusterID(), 20*time.Second)
	if ev.Kind != Update || ev.Member.Record.Endpoint != "198.51.100.9:51820" {
		t.Fatalf("got %v with endpoint %q, want update to 198.51.100.9:51820", ev.Kind, ev.Member.Record.Endpoint)
	}
	cancel()
	for range events {
	}
}

func TestDepartures(t *testing.T) {
	tests := []struct {
		name  string
		stop  func(*Discovery)
		kind  EventKind
		state MemberState
	}{
		{"close leaves", func(d *Discovery) { _ = d.Close() }, Leave, StateLeft},
		{"crash fails", func(d *Discovery) { d.kill() }, Failed, StateFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startNode(t, nodeOpts{})
			b := startNode(t, nodeOpts{seeds: []string{a.addr()}})
			c := startNode(t, nodeOpts{seeds: []string{a.addr()}})
			waitUntil(t, 20*time.Second, func() error { return sees(a, b, c) })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := a.d.Subscribe(ctx)
			tt.stop(b.d)
			for {
				ev := nextEvent(t, events, b.id.ClusterID(), 20*time.Second)
				if ev.Kind == Join || ev.Kind == Update {
					continue // initial state, or the record announcing the leave
				}
				if ev.Kind != tt.kind || ev.Member.State != tt.state {
					t.Fatalf("got %v/%s, want %v/%s", ev.Kind, ev.Member.State, tt.kind, tt.state)
				}
				break
			}
			if err := sees(a, c); err != nil {
				t.Error(err)
			}
			if got := metricValue(t, a.reg, "flotilla_discovery_members", "state="+string(tt.state)); got != 1 {
				t.Errorf("members{state=%s} = %v, want 1", tt.state, got)
			}
		})
	}
}

func TestRestartRejoinsAsSameMember(t *testing.T) {
	a := startNode(t, nodeOpts{})
	bid := mustIdentity(t)
	b := startNode(t, nodeOpts{id: &bid, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	bAddr := b.addr()
	firstSerial := b.d.Snapshot().Self.Serial
	b.d.kill()
	waitUntil(t, 20*time.Second, func() error {
		for _, m := range a.d.Snapshot().Members {
			if m.ClusterID == bid.ClusterID() && m.State == StateFailed {
				return nil
			}
		}
		return fmt.Errorf("a does not report b failed: %+v", a.d.Snapshot().Members)
	})
	// Same identity, same address, as an agent restarted with its state dir.
	b2 := startNode(t, nodeOpts{id: &bid, bind: bAddr, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b2) })
	snap := a.d.Snapshot()
	if len(snap.Members) != 1 || snap.Members[0].ClusterID != bid.ClusterID() {
		t.Fatalf("a's members after restart: %+v, want b once", snap.Members)
	}
	if snap.Members[0].Record.Serial <= firstSerial {
		t.Errorf("restarted record serial %d not above %d", snap.Members[0].Record.Serial, firstSerial)
	}
}

// A cluster's gateway moves to another node when its node dies: the
// same identity comes back at another address once the old one failed,
// and is a member again without waiting for the dead one to be forgotten.
func TestFailedMemberReturnsAtAnotherAddress(t *testing.T) {
	// Never forgotten within the test: only the reclaim lets b back in.
	remember := func(c *memberlist.Config) { c.GossipToTheDeadTime = time.Hour }
	a := startNode(t, nodeOpts{tune: remember})
	bid := mustIdentity(t)
	b := startNode(t, nodeOpts{id: &bid, seeds: []string{a.addr()}, tune: remember})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	b.d.kill()
	waitUntil(t, 20*time.Second, func() error {
		for _, m := range a.d.Snapshot().Members {
			if m.ClusterID == bid.ClusterID() && m.State == StateFailed {
				return nil
			}
		}
		return fmt.Errorf("a does not report b failed: %+v", a.d.Snapshot().Members)
	})
	b2 := startNode(t, nodeOpts{id: &bid, bind: "127.0.0.2:0", seeds: []string{a.addr()}, tune: remember})
	waitUntil(t, 20*time.Second, func() error {
		for _, m := range a.d.Snapshot().Members {
			if m.ClusterID == bid.ClusterID() && m.State == StateAlive && m.Gossip.Addr() == netip.MustParseAddr("127.0.0.2") {
				return nil
			}
		}
		return fmt.Errorf("a does not see b alive at 127.0.0.2: %+v", a.d.Snapshot().Members)
	})
	// b2 learns a from a's answer to its join, which a sends after it
	// took b2 in.
	waitUntil(t, 20*time.Second, func() error { return sees(b2, a) })
}

func TestKeyRotationDropsNoMember(t *testing.T) {
	oldKey, newKey := testKey, bytes.Repeat([]byte{0x77}, 32)
	a := startNode(t, nodeOpts{keys: [][]byte{oldKey}})
	b := startNode(t, nodeOpts{keys: [][]byte{oldKey}, seeds: []string{a.addr()}})
	c := startNode(t, nodeOpts{keys: [][]byte{oldKey}, seeds: []string{a.addr()}})
	all := []*testNode{a, b, c}
	waitUntil(t, 20*time.Second, func() error { return sees(a, b, c) })
	waitUntil(t, 20*time.Second, func() error { return sees(c, a, b) })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []<-chan Event
	for _, n := range all {
		streams = append(streams, n.d.Subscribe(ctx))
	}
	step := func(name string, f func(*Discovery) error) {
		for _, n := range all {
			if err := f(n.d); err != nil {
				t.Fatalf("%s on %s: %v", name, n.id.ClusterID(), err)
			}
			time.Sleep(300 * time.Millisecond) // let gossip run between members' steps
		}
	}
	step("install", func(d *Discovery) error { return d.InstallKey(newKey) })
	step("use", func(d *Discovery) error { return d.UseKey(newKey) })
	step("remove", func(d *Discovery) error { return d.RemoveKey(oldKey) })
	// Witness that failure detection has run under the new key alone long
	// enough: a canary that joins after the rotation and then crashes is
	// declared failed by every member. A member the rotation had cut off
	// would have been declared failed by then too.
	canary := startNode(t, nodeOpts{keys: [][]byte{newKey}, seeds: []string{a.addr()}})
	for _, n := range all {
		waitUntil(t, 20*time.Second, func() error { return sees(n, canary) })
	}
	canary.d.kill()
	for _, n := range all {
		waitUntil(t, 30*time.Second, func() error {
			if slices.Contains(n.d.Alive(), canary.id.ClusterID()) {
				return fmt.Errorf("%s still sees the crashed canary", n.id.ClusterID())
			}
			return nil
		})
	}

	for i, ch := range streams {
	drain:
		for {
			select {
			case ev := <-ch:
				if ev.Member.ClusterID == canary.id.ClusterID() {
					continue
				}
				if ev.Kind == Failed || ev.Kind == Leave {
					t.Errorf("%s saw %v of %s during rotation", all[i].id.ClusterID(), ev.Kind, ev.Member.ClusterID)
				}
			default:
				break drain
			}
		}
	}
	for _, n := range all {
		if len(n.d.Alive()) != 2 {
			t.Errorf("%s sees %v after rotation", n.id.ClusterID(), n.d.Alive())
		}
		if keys := n.d.Keys(); len(keys) != 1 || !bytes.Equal(keys[0], newKey) {
			t.Errorf("keyring after rotation has %d keys", len(keys))
		}
	}
	// A newcomer with only the new key joins; one with only the old key cannot.
	d := startNode(t, nodeOpts{keys: [][]byte{newKey}, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, d) })
	if err := a.d.RemoveKey(newKey); err == nil {
		t.Error("removing the primary key was allowed")
	}
}

func TestOtherFederationIsNeverAMember(t *testing.T) {
	a := startNode(t, nodeOpts{})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}})
	x := startNode(t, nodeOpts{keys: [][]byte{bytes.Repeat([]byte{0x99}, 32)}, seeds: []string{a.addr(), b.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	waitUntil(t, 20*time.Second, func() error {
		if got := metricValue(t, x.reg, "flotilla_discovery_join_failures_total", "source=seed"); got < 2 {
			return fmt.Errorf("x's failed joins = %v", got)
		}
		return nil
	})
	if got := x.d.Alive(); len(got) != 0 {
		t.Errorf("outsider learned members %v", got)
	}
	for _, n := range []*testNode{a, b} {
		if slices.Contains(n.d.Alive(), x.id.ClusterID()) {
			t.Errorf("%s accepted the outsider", n.id.ClusterID())
		}
	}
}

// forger joins the gossip with the federation key but publishes meta that
// is not a valid record of its name, or a replayed one.
type forger struct {
	mu   sync.Mutex
	meta []byte
}

func (f *forger) NodeMeta(int) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.meta
}

func (f *forger) setMeta(meta []byte) {
	f.mu.Lock()
	f.meta = meta
	f.mu.Unlock()
}

func (f *forger) NotifyMsg([]byte)                    {}
func (f *forger) GetBroadcasts(int, int) [][]byte     { return nil }
func (f *forger) LocalState(bool) []byte              { return nil }
func (f *forger) MergeRemoteState(buf []byte, _ bool) {}

func TestForgedRecordsAreDropped(t *testing.T) {
	victim, mallory := mustIdentity(t), mustIdentity(t)
	victimRec, err := SignRecord(victim, Record{Protocol: 1, Serial: 5, Endpoint: "192.0.2.66:51820"})
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Clone(victimRec)
	tampered[len(tampered)-recordSigLen-1] ^= 1 // endpoint changed after signing
	mallorysRec, err := SignRecord(mallory, Record{Protocol: 1, Serial: 5})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, member string
		meta         []byte
		reason       string
	}{
		{"tampered record", victim.ClusterID(), tampered, ReasonBadSignature},
		{"someone else's valid record", mallory.ClusterID(), victimRec, ReasonNameMismatch},
		{"own record under the victim's name", victim.ClusterID(), mallorysRec, ReasonNameMismatch},
		{"garbage", "c" + strings.Repeat("a", 26), []byte("hello"), ReasonMalformed},
		{"no record", mallory.ClusterID(), nil, ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startNode(t, nodeOpts{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := a.d.Subscribe(ctx)

			startForger(t, tt.member, tt.meta, a)
			waitUntil(t, 10*time.Second, func() error {
				if got := metricValue(t, a.reg, "flotilla_discovery_records_dropped_total", "reason="+tt.reason); got == 0 {
					return fmt.Errorf("no record dropped for %s", tt.reason)
				}
				return nil
			})
			time.Sleep(500 * time.Millisecond) // more gossip rounds
			if alive := a.d.Alive(); len(alive) != 0 {
				t.Errorf("forged member accepted: %v", alive)
			}
			select {
			case ev := <-events:
				t.Errorf("event for a forged member: %v %s", ev.Kind, ev.Member.ClusterID)
			default:
			}
		})
	}
}

// startForger joins a's gossip as member name, publishing meta.
func startForger(t testing.TB, name string, meta []byte, a *testNode) (*forger, *memberlist.Memberlist) {
	t.Helper()
	f := &forger{meta: meta}
	mc := memberlist.DefaultLocalConfig()
	fastTimings(mc)
	mc.Name = name
	mc.BindAddr, mc.BindPort, mc.AdvertisePort = "127.0.0.1", 0, 0
	mc.SecretKey = testKey
	mc.Delegate = f
	mc.LogOutput = nopWriter{}
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ml.Shutdown() })
	if _, err := ml.Join([]string{a.addr()}); err != nil {
		t.Fatalf("forger join: %v", err)
	}
	return f, ml
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

func TestSlowSubscriberNeverBlocksGossip(t *testing.T) {
	a := startNode(t, nodeOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stuck := a.d.Subscribe(ctx) // never read until the end
	var nodes []*testNode
	for range 4 {
		nodes = append(nodes, startNode(t, nodeOpts{seeds: []string{a.addr()}}))
	}
	waitUntil(t, 20*time.Second, func() error { return sees(a, nodes...) })
	for i := range 20 {
		n := nodes[i%len(nodes)]
		if err := n.d.SetEndpoint(fmt.Sprintf("192.0.2.%d:51820", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	final := map[string]string{}
	for _, n := range nodes {
		final[n.id.ClusterID()] = n.d.Snapshot().Self.Endpoint
	}
	// Gossip kept running: a sees everyone with their final endpoints.
	waitUntil(t, 20*time.Second, func() error {
		if err := sees(a, nodes...); err != nil {
			return err
		}
		for _, m := range a.d.Snapshot().Members {
			if want := final[m.ClusterID]; m.Record.Endpoint != want {
				return fmt.Errorf("%s endpoint %q, want %q", m.ClusterID, m.Record.Endpoint, want)
			}
		}
		return nil
	})
	// The stuck subscriber now gets at most one queued event per member
	// plus the one that was in flight when it stopped reading, and the
	// last event of each member carries its latest record.
	last := map[string]Event{}
	total := 0
read:
	for {
		select {
		case ev := <-stuck:
			total++
			last[ev.Member.ClusterID] = ev
		case <-time.After(time.Second):
			break read
		}
	}
	if total > len(nodes)+1 {
		t.Errorf("%d events for %d members: not coalesced", total, len(nodes))
	}
	for _, n := range nodes {
		id := n.id.ClusterID()
		ev, ok := last[id]
		if !ok || ev.Member.State != StateAlive || ev.Member.Record.Endpoint != final[id] {
			t.Errorf("%s: last event %v endpoint %q, want alive with %q", id, ev.Kind, ev.Member.Record.Endpoint, final[id])
		}
	}
	if metricValue(t, a.reg, "flotilla_discovery_events_coalesced_total") == 0 {
		t.Error("no coalesced events counted")
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	id := mustIdentity(t)
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no identity", Config{Keys: [][]byte{testKey}, Protocol: testProtocol}},
		{"no key", Config{Identity: id, Protocol: testProtocol}},
		{"no protocol version", Config{Identity: id, Keys: [][]byte{testKey}}},
		{"short key", Config{Identity: id, Protocol: testProtocol, Keys: [][]byte{[]byte("short")}}},
		{"seed without port", Config{Identity: id, Protocol: testProtocol, Keys: [][]byte{testKey}, Seeds: []string{"10.0.0.1"}}},
		{"bad domain", Config{Identity: id, Protocol: testProtocol, Keys: [][]byte{testKey}, DNSDomains: []string{"a..b"}}},
		{"bad endpoint", Config{Identity: id, Protocol: testProtocol, Keys: [][]byte{testKey}, Endpoint: "nowhere"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Error("accepted")
			}
		})
	}
}

// Close waits for every subscriber's goroutine: when it returns, each
// event stream is closed, with nothing left running.
func TestCloseEndsSubscriptions(t *testing.T) {
	a := startNode(t, nodeOpts{})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	streams := make([]<-chan Event, 8)
	for i := range streams {
		streams[i] = a.d.Subscribe(context.Background())
	}
	if err := a.d.Close(); err != nil {
		t.Fatal(err)
	}
	for i, ch := range streams {
	drain:
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					break drain
				}
			default:
				t.Fatalf("stream %d still open after Close returned", i)
			}
		}
	}
}
