package peering

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-io/flotilla/offload/grant"
)

// grantInbox is a GrantReceiver that keeps every call.
type grantInbox struct {
	mu    sync.Mutex
	calls []grantCall
}

type grantCall struct {
	from   string
	key    ed25519.PublicKey
	sealed []byte
}

func (g *grantInbox) GrantReceived(from string, key ed25519.PublicKey, sealed []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, grantCall{from, key, sealed})
}

func (g *grantInbox) received() []grantCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// statements remembers the statements sent to one node, so a test can wait
// until that node accepted the newest one matching what it looks for.
type statements struct {
	mu   sync.Mutex
	to   string
	msgs [][]byte
}

func (s *statements) tap(to string, msg []byte) {
	if to == s.to {
		s.mu.Lock()
		s.msgs = append(s.msgs, msg)
		s.mu.Unlock()
	}
}

// newest returns the newest statement sent that match says yes to.
func (s *statements) newest(match func(h *Hello) bool) (*Hello, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.msgs) - 1; i >= 0; i-- {
		if m, err := Parse(s.msgs[i]); err == nil && match(&m.Hello) {
			return &m.Hello, s.msgs[i]
		}
	}
	return nil, nil
}

// accepted waits until n accepted from peer a statement match says yes to
// (n publishes the generation of the statement it last accepted), and
// returns that statement as sent.
func (s *statements) accepted(t *testing.T, what string, n, peer *node, match func(h *Hello) bool) []byte {
	t.Helper()
	var msg []byte
	within(t, what, func() error {
		var h *Hello
		if h, msg = s.newest(match); h == nil {
			return errors.New("no such statement sent yet")
		}
		if g := stateOf(n, peer).StatementGeneration; g < h.Generation {
			return fmt.Errorf("accepted generation %d, sent %d", g, h.Generation)
		}
		return nil
	})
	return msg
}

func carries(g []byte) func(h *Hello) bool {
	return func(h *Hello) bool { return bytes.Equal(h.Grant, g) }
}

// A grant set on the provider reaches the consumer's receiver once, with
// the provider's key; a new grant reaches it again; clearing it calls
// nothing; an old statement replayed with an old grant is refused and
// delivers nothing.
func TestGrantReachesTheConsumerOnce(t *testing.T) {
	net := &network{}
	inbox := &grantInbox{}
	provider := newNode(t, net, nodeOptions{})
	consumer := newNode(t, net, nodeOptions{grants: inbox})
	sent := &statements{to: consumer.id.ClusterID()}
	net.tap = sent.tap
	meet(provider, consumer)
	within(t, "connected", func() error { return connected(provider, consumer) })
	if key := stateOf(provider, consumer).IdentityKey; !key.Equal(consumer.id.Public()) {
		t.Fatal("the provider's state of the consumer does not carry the key to seal grants to")
	}

	g1, g2 := []byte("sealed grant, serial 1"), []byte("sealed grant, serial 2")
	if err := provider.eng.SetGrant(consumer.id.ClusterID(), g1); err != nil {
		t.Fatal(err)
	}
	first := sent.accepted(t, "grant 1 accepted", consumer, provider, carries(g1))
	// The provider's own statements settle; a later one, and resends,
	// carry the same grant and deliver nothing more.
	provider.eng.SetNetworks([]netip.Prefix{pods, netip.MustParsePrefix("10.9.0.0/16")})
	sent.accepted(t, "a later statement with grant 1 accepted", consumer, provider, func(h *Hello) bool {
		return bytes.Equal(h.Grant, g1) && len(h.Networks) == 2
	})
	if calls := inbox.received(); len(calls) != 1 || !bytes.Equal(calls[0].sealed, g1) ||
		calls[0].from != provider.id.ClusterID() || !calls[0].key.Equal(provider.id.Public()) {
		t.Fatalf("%d calls for grant 1 (want 1, from the provider with its key)", len(calls))
	}

	if err := provider.eng.SetGrant(consumer.id.ClusterID(), g2); err != nil {
		t.Fatal(err)
	}
	sent.accepted(t, "grant 2 accepted", consumer, provider, carries(g2))
	if calls := inbox.received(); len(calls) != 2 || !bytes.Equal(calls[1].sealed, g2) {
		t.Fatalf("%d calls after grant 2, want 2 with grant 2 last", len(calls))
	}

	if err := provider.eng.SetGrant(consumer.id.ClusterID(), nil); err != nil {
		t.Fatal(err)
	}
	sent.accepted(t, "a statement without a grant accepted", consumer, provider, carries(nil))
	if calls := inbox.received(); len(calls) != 2 {
		t.Fatalf("%d calls after the grant was cleared, want still 2", len(calls))
	}

	consumer.eng.Receive(first)
	refusedOnce(t, "the statement with grant 1 replayed", consumer, "replayed")
	if calls := inbox.received(); len(calls) != 2 {
		t.Fatalf("%d calls after a replay of grant 1, want still 2", len(calls))
	}
}

// A restarted consumer hands the grant of the statement it restored to
// its receiver again, once the provider is a member: whether the receiver
// kept it before the restart is the receiver's to know.
func TestGrantRedeliveredAfterRestart(t *testing.T) {
	net := &network{}
	inbox := &grantInbox{}
	provider := newNode(t, net, nodeOptions{})
	consumer := newNode(t, net, nodeOptions{grants: inbox})
	sent := &statements{to: consumer.id.ClusterID()}
	net.tap = sent.tap
	meet(provider, consumer)
	g := []byte("sealed grant")
	if err := provider.eng.SetGrant(consumer.id.ClusterID(), g); err != nil {
		t.Fatal(err)
	}
	sent.accepted(t, "grant accepted", consumer, provider, carries(g))
	consumer.stop()
	again := &grantInbox{}
	consumer = newNode(t, net, nodeOptions{seed: consumer, grants: again})
	consumer.eng.MemberChanged(provider.member(true))
	within(t, "the grant delivered after the restart", func() error {
		if calls := again.received(); len(calls) != 1 || !bytes.Equal(calls[0].sealed, g) {
			return fmt.Errorf("%d calls", len(calls))
		}
		return nil
	})
}

// SetGrant refuses what no statement can carry, at once.
func TestSetGrantRefusesWhatCannotBeSent(t *testing.T) {
	n := newNode(t, &network{}, nodeOptions{})
	other := mustIdentity(t).ClusterID()
	for _, tc := range []struct {
		name string
		id   string
		g    []byte
	}{
		{"bad cluster ID", "peer-1", []byte("g")},
		{"itself", n.id.ClusterID(), []byte("g")},
		{"too large", other, make([]byte, MaxGrantSize+1)},
	} {
		if err := n.eng.SetGrant(tc.id, tc.g); err == nil {
			t.Errorf("%s: SetGrant accepted it", tc.name)
		}
	}
}

// The largest grant there is, in a statement with as many networks and
// views and as many bytes of labels as one carries, fits in a message.
func TestLargestGrantFitsAStatement(t *testing.T) {
	if grant.MaxSealedSize > MaxGrantSize {
		t.Fatalf("grants seal to %d bytes, statements carry %d", grant.MaxSealedSize, MaxGrantSize)
	}
	a, b := mustIdentity(t), mustIdentity(t)
	h := sampleHello(a, b)
	h.Name = strings.Repeat("n", maxNameLength)
	h.Networks, h.ViewsOfYou = nil, nil
	for i := range MaxNetworks {
		n := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 128, 0}), 24)
		h.Networks = append(h.Networks, n)
		h.ViewsOfYou = append(h.ViewsOfYou, ViewClaim{Range: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(i), 0}), 24),
			As: netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 96, byte(i), 0}), 24)})
	}
	h.Grant = bytes.Repeat([]byte{0xff}, MaxGrantSize)
	h.Labels = map[string]string{}
	for i := range MaxLabels {
		h.Labels[fmt.Sprintf("%s/%02d", strings.Repeat("k", 60), i)] = strings.Repeat("v", MaxLabelsSize/MaxLabels-63)
	}
	if err := CheckLabels(h.Labels); err != nil {
		t.Fatalf("not the largest labels there are: %v", err)
	}
	msg, err := Seal(h, a)
	if err != nil {
		t.Fatalf("Seal of the largest statement: %v", err)
	}
	if _, err := Parse(msg); err != nil {
		t.Fatalf("Parse of the largest statement: %v", err)
	}
	t.Logf("largest statement: %d bytes of %d", len(msg), maxMessageSize)
}

// A Hello of version 3, which has no grant field, is read: it carries no
// grant, which says nothing.
func TestVersion3HelloIsRead(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	payload := withFields(t, sampleHello(a, b), map[string]any{"protocol": 3, "protocolMax": 4})
	s, err := Parse(reseal(payload, a))
	if err != nil {
		t.Fatalf("Parse of version 3: %v", err)
	}
	if err := s.Verify(a.Public()); err != nil || s.Hello.Grant != nil || s.Hello.Protocol != 3 {
		t.Fatalf("read %v, grant of %d bytes, protocol %d", err, len(s.Hello.Grant), s.Hello.Protocol)
	}
}

// previousRelease reads a statement as the release before grants did: it
// reads versions 2 to 4 and knows these fields; others it ignores.
func previousRelease(t *testing.T, msg []byte) (fields map[string]json.RawMessage, ignored []string) {
	t.Helper()
	known := []string{"protocol", "protocolMin", "protocolMax", "from", "to", "generation", "name", "networks",
		"wireguardKey", "endpoint", "decision", "viewsOfYou", "tunnelReady"}
	s, err := Parse(msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(s.Payload(), &fields); err != nil {
		t.Fatal(err)
	}
	var v uint16
	json.Unmarshal(fields["protocol"], &v)
	if v < 2 || v > 4 {
		t.Fatalf("the previous release reads versions 2 to 4; this one writes %d", v)
	}
	for k := range fields {
		if !slices.Contains(known, k) {
			ignored = append(ignored, k)
			delete(fields, k)
		}
	}
	return fields, ignored
}

// The release before grants (it wrote 3 and read up to 4) reads what this
// one writes: the version is in its range and the grant and the labels
// are the only fields it does not know, which it ignores.
func TestPreviousReleaseReadsThisVersion(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	h := sampleHello(a, b)
	h.Grant = []byte("sealed grant")
	h.TunnelReady = true
	h.Labels = map[string]string{"region": "a"}
	msg, err := Seal(h, a)
	if err != nil {
		t.Fatal(err)
	}
	fields, ignored := previousRelease(t, msg)
	slices.Sort(ignored)
	if !slices.Equal(ignored, []string{"grant", "labels"}) {
		t.Fatalf("the previous release ignores %v, want only the grant and the labels", ignored)
	}
	// What it reads, resealed by itself, is a valid statement for it.
	payload, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse(reseal(payload, a))
	if err != nil || s.Hello.Name != "east" || !s.Hello.TunnelReady {
		t.Fatalf("what the previous release reads: %v", err)
	}
}
