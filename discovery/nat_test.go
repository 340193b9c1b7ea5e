package discovery

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"
)

// A member whose advertised address nobody can reach (192.0.2.1, TEST-NET:
// it stands for the private address behind a NAT) joins a reachable one.
// Saying so in its record, it stays alive and messages go both ways: the
// reachable member reaches it only through what it sends. Without saying
// so it is declared failed, as it is today behind a NAT.
func TestMemberBehindNAT(t *testing.T) {
	for _, tt := range []struct {
		name         string
		outboundOnly bool
	}{
		{"says it is outbound only", true},
		{"says nothing", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inA, inB := newInbox(), newInbox()
			a := startNode(t, nodeOpts{onMessage: inA.handler})
			events := a.d.Subscribe(t.Context())
			b := startNode(t, nodeOpts{seeds: []string{a.addr()}, advertise: "192.0.2.1:0",
				outboundOnly: tt.outboundOnly, onMessage: inB.handler})
			if ev := nextEvent(t, events, b.id.ClusterID(), 10*time.Second); ev.Kind != Join {
				t.Fatalf("a's first event of b: %v, want a join", ev.Kind)
			}
			// 3 s: 15 of a's probes of b, a push/pull each way, and the
			// suspicion timeout several times over.
			failed := make(chan Event, 1)
			go func() {
				for ev := range events {
					if ev.Member.ClusterID == b.id.ClusterID() && ev.Kind == Failed {
						failed <- ev
						return
					}
				}
			}()
			select {
			case <-failed:
				if tt.outboundOnly {
					t.Fatalf("a declared b, behind NAT and saying so, failed")
				}
				return // as without NAT traversal: the outcome recorded
			case <-time.After(3 * time.Second):
				if !tt.outboundOnly {
					t.Fatalf("a kept b, unreachable and not saying so, alive for 3 s: the control does not show the failure")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := a.d.Send(ctx, b.id.ClusterID(), []byte("to b behind NAT")); err != nil {
				t.Fatalf("a to b: %v", err)
			}
			if got := inB.next(t, 5*time.Second); string(got) != "to b behind NAT" {
				t.Errorf("b got %q", got)
			}
			if err := b.d.Send(ctx, a.id.ClusterID(), []byte("from b")); err != nil {
				t.Fatalf("b to a: %v", err)
			}
			if got := inA.next(t, 5*time.Second); string(got) != "from b" {
				t.Errorf("a got %q", got)
			}
			if err := sees(a, b); err != nil {
				t.Error(err)
			}
		})
	}
}

func fixedClock(at time.Time) func() time.Time { return func() time.Time { return at } }

// What a member accepts of the NAT traversal's packets.
func TestNATPacketRefusals(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	key, other := testKey, bytes.Repeat([]byte{0x77}, 32)
	behind := newNATTraversal(true, func() [][]byte { return [][]byte{key} }, fixedClock(now))
	behind.setAdvertise(netip.MustParseAddrPort("10.1.0.2:7946"))
	reach := netip.MustParseAddrPort("198.18.0.3:7946")
	ann := behind.announcement(reach, false)
	if ann == nil {
		t.Fatal("no announcement to a new destination")
	}
	if again := behind.announcement(reach, false); again != nil {
		t.Error("announced again within announceEvery")
	}
	req, _, cancel, err := behind.expectDialBack()
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	resign := func(b []byte, k []byte) []byte {
		body := bytes.Clone(b[:len(b)-natMACLen])
		return append(body, natMAC(k, body)...)
	}
	at := func(b []byte, sent time.Time) []byte {
		c := bytes.Clone(b)
		for i := range 8 {
			c[4+i] = byte(uint64(sent.UnixNano()) >> (56 - 8*i))
		}
		return resign(c, key)
	}
	for _, tt := range []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"announcement", ann, true},
		{"dial-back request", req, true},
		{"signed with another federation's key", resign(ann, other), false},
		{"tampered address", func() []byte { b := bytes.Clone(ann); b[len(b)-natMACLen-1] ^= 1; return b }(), false},
		{"too old", at(ann, now.Add(-natClockSkew-time.Second)), false},
		{"from the future", at(ann, now.Add(natClockSkew+time.Second)), false},
		{"truncated", ann[:natHeaderLen+3], false},
		{"unknown kind", func() []byte { b := bytes.Clone(ann); b[3] = 9; return resign(b, key) }(), false},
		{"address length lies", func() []byte { b := bytes.Clone(ann); b[natHeaderLen]++; return resign(b, key) }(), false},
		{"empty", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The receiver is in a key rotation: either key verifies.
			_, err := decodeNATPacket(tt.in, [][]byte{bytes.Repeat([]byte{0x55}, 32), key}, now)
			if (err == nil) != tt.ok {
				t.Errorf("decode: %v, want accepted %v", err, tt.ok)
			}
		})
	}
}

// The reachable side routes to where a member behind NAT announced itself
// from, only for members whose record says so, and a replayed older
// announcement does not move the route; the member behind NAT dials back
// only to members it announced itself to.
func TestNATRoutes(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	keys := func() [][]byte { return [][]byte{testKey} }
	clock := now
	behind := newNATTraversal(true, keys, func() time.Time { return clock })
	adv := netip.MustParseAddrPort("10.1.0.2:7946")
	behind.setAdvertise(adv)
	reach := newNATTraversal(false, keys, func() time.Time { return clock })
	a := netip.MustParseAddrPort("198.18.0.3:7946")
	nat1, nat2 := netip.MustParseAddrPort("198.18.0.9:40001"), netip.MustParseAddrPort("198.18.0.9:40002")

	first := behind.announcement(a, true)
	clock = clock.Add(time.Second)
	second := behind.announcement(a, true)
	for _, in := range []struct {
		b    []byte
		from netip.AddrPort
	}{{second, nat2}, {first, nat1}} { // the older one arrives last
		p, err := decodeNATPacket(in.b, keys(), clock)
		if err != nil {
			t.Fatal(err)
		}
		reach.announced(p, in.from)
	}
	if to, ok := reach.route(adv); ok || to != adv {
		t.Errorf("routed %s to %s before its record said it is behind NAT", adv, to)
	}
	reach.setBehind(adv, true)
	if to, ok := reach.route(adv); !ok || to != nat2 {
		t.Errorf("routed %s to %s (%v), want the newer mapping %s", adv, to, ok, nat2)
	}
	reach.setBehind(adv, false)
	if to, _ := reach.route(adv); to != adv {
		t.Errorf("routed %s to %s after its record stopped saying it is behind NAT", adv, to)
	}

	if !behind.mayDialBack(a) {
		t.Errorf("no dial-back to %s, announced to", a)
	}
	if stranger := netip.MustParseAddrPort("203.0.113.5:7946"); behind.mayDialBack(stranger) {
		t.Errorf("would dial back to %s, never announced to", stranger)
	}
	if reach.mayDialBack(a) {
		t.Error("a reachable member dials back")
	}
}
