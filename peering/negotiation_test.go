package peering

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Three clusters with the same PodCIDR: every pair agrees, and every
// cluster's views of its peers are disjoint and remapped.
func TestNegotiationConverges(t *testing.T) {
	net := &network{}
	var sent atomic.Int64
	net.tap = func(string, []byte) { sent.Add(1) }
	a, b, c := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b, c)
	nodes := []*node{a, b, c}
	for _, pair := range [][2]*node{{a, b}, {a, c}, {b, c}} {
		within(t, "pair connected", func() error { return connected(pair[0], pair[1]) })
	}
	for _, n := range nodes {
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
	}
	// Configured, but Connected only once WireGuard says so.
	for _, n := range nodes {
		for _, o := range nodes {
			if o != n {
				if s := inPhase(t, n, o, PhaseNegotiating); s.TunnelUp.Reason != "NoHandshake" {
					t.Fatalf("configured without a handshake: %+v", s.TunnelUp)
				}
				n.dp.handshake(o.id.ClusterID(), time.Now())
			}
		}
	}
	for _, n := range nodes {
		for _, o := range nodes {
			if o != n {
				inPhase(t, n, o, PhaseConnected)
			}
		}
	}
	// Settled: resends carry no new generation. Witness: at least two
	// rounds of resends went out meanwhile.
	issued := testutil.ToFloat64(a.eng.metrics.sent)
	before := sent.Load()
	within(t, "two resend rounds", func() error {
		if n := sent.Load() - before; n < 2*6 {
			return fmt.Errorf("%d messages sent", n)
		}
		return nil
	})
	if now := testutil.ToFloat64(a.eng.metrics.sent); now != issued {
		t.Errorf("a issued %v new statements after settling", now-issued)
	}
}

func TestManualPolicyWaitsForBothSides(t *testing.T) {
	net := &network{}
	manual := nodeOptions{policy: PolicyManual}
	a, b := newNode(t, net, manual), newNode(t, net, manual)
	meet(a, b)
	inPhase(t, a, b, PhaseDiscovered)
	inPhase(t, b, a, PhaseDiscovered)
	acceptedByB := testutil.ToFloat64(b.eng.metrics.accepted)
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Networking: NetworkingAccept, Generation: 2})
	// Witness: a acted on its spec, and b has a's statement saying so.
	within(t, "a accepts, b heard it", func() error {
		s := stateOf(a, b)
		if s.SpecGeneration != 2 || s.Accepted.Reason != "WaitingForPeer" {
			return fmt.Errorf("a: generation %d, %+v", s.SpecGeneration, s.Accepted)
		}
		if testutil.ToFloat64(b.eng.metrics.accepted) <= acceptedByB {
			return errors.New("b has not accepted a's new statement")
		}
		return nil
	})
	if _, ok := a.dp.peer(b.id.ClusterID()); ok {
		t.Fatal("a configured a tunnel that b has not accepted")
	}
	if len(a.ledger.Views("")) != 0 {
		t.Fatal("a allocated a view before both sides accepted")
	}
	b.eng.SpecChanged(a.id.ClusterID(), Spec{Networking: NetworkingAccept, Generation: 1})
	within(t, "connected after both accepted", func() error { return connected(a, b) })
}

// Deny on one side tears down both sides and quarantines both views;
// deleting the Peer object resets and reconnects under auto.
func TestDenyAndResetTearDownBothSides(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Networking: NetworkingDeny, Generation: 2})
	within(t, "both sides torn down", func() error {
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
	inPhase(t, a, b, PhaseDenied)
	inPhase(t, b, a, PhaseDenied)
	a.eng.SpecChanged(b.id.ClusterID(), Spec{Generation: 3})
	within(t, "reconnected after the deny was lifted", func() error { return connected(a, b) })

	a.eng.SpecDeleted(b.id.ClusterID()) // the admin deletes the Peer
	within(t, "b tore down after a's reset", func() error {
		if _, ok := b.dp.peer(a.id.ClusterID()); ok {
			return errors.New("b still has a tunnel to a")
		}
		return nil
	})
	within(t, "reconnected after the reset", func() error { return connected(a, b) })
}

// Refusals: replayed and forged statements change nothing.
func TestRefusesReplaysAndForgeries(t *testing.T) {
	net := &network{}
	var mu sync.Mutex
	var fromA [][]byte
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	net.tap = func(to string, msg []byte) {
		if to == b.id.ClusterID() {
			mu.Lock()
			fromA = append(fromA, msg)
			mu.Unlock()
		}
	}
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	before, _ := b.dp.peer(a.id.ClusterID())
	_, applies := b.dp.desired()

	mu.Lock()
	oldest := fromA[0]
	mu.Unlock()
	b.eng.Receive(oldest)
	refusedOnce(t, "replay refused", b, "replayed")

	// Mallory, not a member, speaks (her message waits for a member event
	// that never comes); then she signs a statement claiming to be a.
	mallory, _ := identity.Generate()
	h := &Hello{From: mallory.ClusterID(), To: b.id.ClusterID(), Generation: 1 << 62,
		Networks: []netip.Prefix{pods}, WireGuardKey: make([]byte, 32), Endpoint: netip.MustParseAddrPort("198.18.9.9:51820"), Decision: Accept}
	msg, err := Seal(h, mallory)
	if err != nil {
		t.Fatal(err)
	}
	b.eng.Receive(msg)
	within(t, "mallory's message held", func() error {
		if v := testutil.ToFloat64(b.eng.metrics.held); v != 1 {
			return fmt.Errorf("%v messages held", v)
		}
		return nil
	})
	forged, err := Parse(msg)
	if err != nil {
		t.Fatal(err)
	}
	forged.Hello.From = a.id.ClusterID()
	payload, _ := json.Marshal(forged.Hello)
	b.eng.Receive(reseal(payload, mallory))
	refusedOnce(t, "forgery refused", b, "forged")
	after, _ := b.dp.peer(a.id.ClusterID())
	if _, n := b.dp.desired(); after.Endpoint != before.Endpoint || n != applies {
		t.Fatalf("a refused message changed b's data path: %v -> %v (%d applies, was %d)", before.Endpoint, after.Endpoint, n, applies)
	}
	if _, ok := b.rec.latest(mallory.ClusterID()); ok || peersKnown(b) != 1 {
		t.Fatalf("b knows %d peers, want 1 (mallory must not appear)", peersKnown(b))
	}
}

// A statement that overtakes its sender's join event is not lost: it is
// processed when the member appears.
func TestMessageBeforeMemberEvent(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	// Only a learns of b: a's hello reaches b, which does not know a yet.
	a.eng.MemberChanged(b.member(true))
	within(t, "a's statement held by b", func() error {
		if v := testutil.ToFloat64(b.eng.metrics.held); v != 1 {
			return fmt.Errorf("%v messages held", v)
		}
		return nil
	})
	if got := testutil.ToFloat64(b.eng.metrics.accepted); got != 0 {
		t.Fatalf("b accepted %v statements from an unknown sender", got)
	}
	b.eng.MemberChanged(a.member(true))
	within(t, "connected", func() error { return connected(a, b) })
	if v := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("forged")); v != 0 {
		t.Fatalf("an early genuine statement was counted as forged (%v)", v)
	}
}

// A member announcing another's WireGuard key (it is public) is left out
// of the data path alone: the established peer stays connected, and the
// newcomer's Peer says why.
func TestCopiedKeyIsLeftOutAlone(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	copycat, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	seed := &node{id: copycat, path: filepath.Join(t.TempDir(), ipam.FileName), dp: &fakeDataplane{key: b.dp.key}}
	c := newNode(t, net, nodeOptions{seed: seed})
	meet(a, b, c)
	s := inPhase(t, a, c, PhaseDegraded)
	if s.TunnelUp.Reason != "Refused" || !strings.Contains(s.TunnelUp.Message, "public key") {
		t.Fatalf("c's TunnelUp: %+v", s.TunnelUp)
	}
	if err := connected(a, b); err != nil {
		t.Fatalf("the copycat broke a and b: %v", err)
	}
	if _, ok := a.dp.peer(c.id.ClusterID()); ok {
		t.Fatal("a configured the copycat")
	}
}

// Once settled, a federation sends only its periodic resends: a received
// duplicate must not set off more messages (it once did: every reconcile
// resent to every peer, ~19,000 messages in 2 s here instead of 60).
func TestSettledFederationOnlyResends(t *testing.T) {
	net := &network{}
	var sent atomic.Int64
	net.tap = func(string, []byte) { sent.Add(1) }
	a, b, c := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b, c)
	for _, pair := range [][2]*node{{a, b}, {a, c}, {b, c}} {
		within(t, "connected", func() error { return connected(pair[0], pair[1]) })
	}
	time.Sleep(500 * time.Millisecond)
	const window = 2 * time.Second
	before := sent.Load()
	time.Sleep(window)
	// 6 directed pairs, one resend per 200 ms interval each: 60. At least
	// one round must have gone out, or nothing was measured.
	rounds := int64(window / (200 * time.Millisecond))
	if got, limit := sent.Load()-before, 2*6*rounds; got > limit || got < 6 {
		t.Fatalf("%d messages in %s while settled, want 6 to %d (%d resend rounds)", got, window, limit, rounds)
	}
}

// A resent statement changes nothing, so it starts no pass over every
// peer: at 100 peers one arrives every 50 ms.
func TestResendsStartNoReconcile(t *testing.T) {
	net := &network{}
	var mu sync.Mutex
	var fromA []byte
	a, b := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	net.tap = func(to string, msg []byte) {
		if to == b.id.ClusterID() {
			mu.Lock()
			fromA = msg
			mu.Unlock()
		}
	}
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	mu.Lock()
	last := fromA
	mu.Unlock()
	start := time.Now()
	reconciles := testutil.ToFloat64(b.eng.metrics.reconciles)
	repeated := testutil.ToFloat64(b.eng.metrics.repeated)
	const resends = 40
	for i := range resends {
		b.eng.Receive(last)
		// Each handled before the next: a burst would be one reconcile
		// whatever each message caused.
		within(t, "the resend taken as one", func() error {
			if v := testutil.ToFloat64(b.eng.metrics.repeated); v < repeated+float64(i+1) {
				return fmt.Errorf("%v resends taken, want %d", v-repeated, i+1)
			}
			return nil
		})
	}
	// What reconciles anyway: the tick, once a second, and a read of the
	// tunnel's status, at most once a second while settled.
	limit := 2*int(time.Since(start)/time.Second) + 4
	if n := int(testutil.ToFloat64(b.eng.metrics.reconciles) - reconciles); n > limit {
		t.Fatalf("%d reconciles for %d resends, want at most %d (the tick's and the tunnel status reads')", n, resends, limit)
	}
	if err := connected(a, b); err != nil {
		t.Fatalf("after the resends: %v", err)
	}
}

// An agent of the next protocol version, which writes fields this one does
// not know, peers with this one: clusters upgrade one at a time.
func TestNextProtocolVersionPeers(t *testing.T) {
	net := &network{}
	a := newNode(t, net, nodeOptions{})
	next := newNode(t, net, nodeOptions{rewrite: func(id identity.Identity, msg []byte) []byte {
		return nextVersion(t, id, msg)
	}})
	meet(a, next)
	within(t, "connected", func() error { return connected(a, next) })
	if v := testutil.ToFloat64(a.eng.metrics.refused.WithLabelValues("malformed")) + testutil.ToFloat64(a.eng.metrics.refused.WithLabelValues("incompatible")); v != 0 {
		t.Fatalf("a refused %v of the newer agent's messages", v)
	}
}

// nextVersion rewrites msg as the next protocol version would write it: a
// higher version, within range, with a field this version does not know.
func nextVersion(t *testing.T, id identity.Identity, msg []byte) []byte {
	return rewritten(t, id, msg, func(fields map[string]any) {
		fields["protocol"], fields["protocolMin"], fields["protocolMax"] = ProtocolVersionMax, ProtocolVersionMin, ProtocolVersionMax+1
		fields["relays"] = []string{"198.18.7.7:51820"}
	})
}

// Each side's statement says when its data path holds the other, and each
// hands what the other says to its tunnel, which then knows when to stop
// waiting for the first handshake (tunnel's first contact). A peer of
// version 2 says nothing, and its silence means nothing: the tunnel
// guesses.
func TestPeersSayWhenTheirDataPathHoldsUs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rewrite func(fields map[string]any)
		want    tunnel.FirstContact
	}{
		{"says so", nil, tunnel.FirstContactReady},
		{"never says so", func(f map[string]any) { delete(f, "tunnelReady") }, tunnel.FirstContactAnnounced},
		{"version 2", func(f map[string]any) {
			delete(f, "tunnelReady")
			f["protocol"], f["protocolMax"] = 2, 3
		}, tunnel.FirstContactGuess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := &network{}
			a := newNode(t, net, nodeOptions{})
			var o nodeOptions
			if tc.rewrite != nil {
				o.rewrite = func(id identity.Identity, msg []byte) []byte { return rewritten(t, id, msg, tc.rewrite) }
			}
			b := newNode(t, net, o)
			meet(a, b)
			within(t, "both data paths holding the other", func() error {
				if _, ok := b.dp.peer(a.id.ClusterID()); !ok {
					return errors.New("b's does not")
				}
				if p, ok := a.dp.peer(b.id.ClusterID()); !ok || p.FirstContact != tc.want {
					return fmt.Errorf("a's holds b %v, told %q, want %q", ok, p.FirstContact, tc.want)
				}
				return nil
			})
			if tc.rewrite == nil {
				within(t, "b's tunnel told what a says", func() error {
					if p, _ := b.dp.peer(a.id.ClusterID()); p.FirstContact != tunnel.FirstContactReady {
						return fmt.Errorf("first contact %q", p.FirstContact)
					}
					return nil
				})
			}
		})
	}
}

// rewritten is msg with its fields changed by change, signed again by id.
func rewritten(t *testing.T, id identity.Identity, msg []byte, change func(fields map[string]any)) []byte {
	s, err := Parse(msg)
	if err != nil {
		t.Errorf("parse own message: %v", err)
		return msg
	}
	dec := json.NewDecoder(strings.NewReader(string(s.Payload())))
	dec.UseNumber() // generations do not fit a float64
	var fields map[string]any
	if err := dec.Decode(&fields); err != nil {
		t.Errorf("decode own message: %v", err)
		return msg
	}
	change(fields)
	payload, err := json.Marshal(fields)
	if err != nil {
		t.Errorf("encode: %v", err)
		return msg
	}
	return reseal(payload, id)
}
