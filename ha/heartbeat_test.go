package ha

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func heldBy(holder, version string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName, ResourceVersion: version},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)},
	}
}

// A standby takes early only once the path to the active replica worked
// both ways (a counting ping acknowledged one of its answers), only when
// both the counting pings and the renewals have stopped for long enough,
// and only within takeWindow after the silence.
func TestHeartbeatStandbyTakesEarly(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	silence, unrenewed := time.Second, 1500*time.Millisecond
	h := &Heartbeat{me: "gw2_b"}
	h.leaseSeen(heldBy("gw1_a", "10"), t0)
	ping := func(seq, ack uint64, counts bool, at time.Duration) {
		t.Helper()
		reply, ok := h.pinged(beat{kind: beatPing, nonce: 7, seq: seq, ack: ack, counts: counts, from: "gw1_a"}, t0.Add(at))
		if !ok || reply.kind != beatAnswer || reply.seq != seq || reply.nonce != 7 || reply.counts != counts || reply.from != "gw2_b" {
			t.Fatalf("ping %d answered %+v, %v; want an answer to it from gw2_b", seq, reply, ok)
		}
	}
	ping(5, 0, true, 0)
	if l := h.silent(t0.Add(1500*time.Millisecond), silence, unrenewed); l != nil {
		t.Fatal("took early before a ping acknowledged an answer: the active replica may not know this standby hears it")
	}
	ping(6, 4, true, 100*time.Millisecond) // acknowledges an answer before this standby's first
	if l := h.silent(t0.Add(1500*time.Millisecond), silence, unrenewed); l != nil {
		t.Fatal("took early on an acknowledgement of an answer it did not give")
	}
	ping(7, 5, true, 200*time.Millisecond)
	ping(8, 7, false, 900*time.Millisecond) // a probe: the silence runs on
	for _, tc := range []struct {
		name string
		at   time.Duration
		want bool
	}{
		{"pings stopped, renewed recently", 1300 * time.Millisecond, false},
		{"renewals stopped, pinged recently", 1100 * time.Millisecond, false},
		{"both stopped", 1500 * time.Millisecond, true},
		{"both stopped, the window about to close", 3100 * time.Millisecond, true},
		{"silent past the window", 3200 * time.Millisecond, false},
	} {
		if got := h.silent(t0.Add(tc.at), silence, unrenewed) != nil; got != tc.want {
			t.Errorf("%s (+%s): takes %v, want %v", tc.name, tc.at, got, tc.want)
		}
	}
	// A renewal seen starts the wait again.
	ping(9, 7, true, 900*time.Millisecond)
	h.leaseSeen(heldBy("gw1_a", "11"), t0.Add(time.Second))
	if l := h.silent(t0.Add(2*time.Second), silence, unrenewed); l != nil {
		t.Error("took early 1 s after a renewal")
	}
	if l := h.silent(t0.Add(2500*time.Millisecond), silence, unrenewed); l == nil || l.ResourceVersion != "11" {
		t.Errorf("1.5 s after the last renewal, silent for 1.6 s: got %v, want the Lease as last seen", l)
	}

	// Another holder: nothing heard from it yet, and pings from the old
	// one are not answered.
	h.leaseSeen(heldBy("gw3_c", "12"), t0.Add(3*time.Second))
	if _, ok := h.pinged(beat{kind: beatPing, nonce: 7, seq: 10, ack: 9, counts: true, from: "gw1_a"}, t0.Add(3*time.Second)); ok {
		t.Error("answered a replica the Lease does not name")
	}
	if l := h.silent(t0.Add(4500*time.Millisecond), silence, unrenewed); l != nil {
		t.Error("took early from a holder never heard")
	}
	// A new run of the holder (a new nonce) starts again.
	h.pinged(beat{kind: beatPing, nonce: 1, seq: 1, counts: true, from: "gw3_c"}, t0.Add(3*time.Second))
	h.pinged(beat{kind: beatPing, nonce: 1, seq: 2, ack: 1, counts: true, from: "gw3_c"}, t0.Add(3*time.Second))
	h.pinged(beat{kind: beatPing, nonce: 2, seq: 1, counts: true, from: "gw3_c"}, t0.Add(3*time.Second))
	if l := h.silent(t0.Add(4500*time.Millisecond), silence, unrenewed); l != nil {
		t.Error("took early from a new run of the holder before it acknowledged an answer")
	}
}

// The active replica is fenced before the earliest instant a standby
// could take early: Silence after the newest counting ping it answered,
// and Unrenewed after the last renewal; a standby that never answered
// one does not count, nor one whose window has surely closed.
func TestHeartbeatFencesTheActiveFirst(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := netip.MustParseAddrPort("198.18.0.2:7947"), netip.MustParseAddrPort("198.18.0.3:7947")
	h := &Heartbeat{me: "gw1_a", nonce: 9, sent: map[uint64]time.Time{},
		standbys: map[netip.AddrPort]*standby{a: {counted: t0.Add(100 * time.Millisecond)}, b: {counted: t0.Add(100 * time.Millisecond)}}}
	if got := h.earliestTake(t0, t0); !got.IsZero() {
		t.Fatalf("no answer yet: earliest %v, want none", got)
	}
	h.sent[3], h.sent[4], h.sent[5] = t0, t0.Add(100*time.Millisecond), t0.Add(200*time.Millisecond)
	h.answeredBy(a, beat{kind: beatAnswer, nonce: 9, seq: 4, counts: true})
	h.answeredBy(a, beat{kind: beatAnswer, nonce: 9, seq: 3, counts: true})                                          // late: not older
	h.answeredBy(a, beat{kind: beatAnswer, nonce: 9, seq: 5})                                                        // a probe's: says nothing of the silence
	h.answeredBy(b, beat{kind: beatAnswer, nonce: 8, seq: 3, counts: true})                                          // another run's
	h.answeredBy(netip.MustParseAddrPort("198.18.0.9:7947"), beat{kind: beatAnswer, nonce: 9, seq: 3, counts: true}) // not a replica
	renewed := t0.Add(-time.Second)
	if got, want := h.earliestTake(renewed, t0), t0.Add(1100*time.Millisecond); !got.Equal(want) {
		t.Errorf("answered at +100ms, renewed at -1s: earliest %v, want +1.1s (silence after the answer)", got.Sub(t0))
	}
	if got, want := h.earliestTake(t0, t0), t0.Add(1500*time.Millisecond); !got.Equal(want) {
		t.Errorf("renewed at 0: earliest %v, want +1.5s (unrenewed after the renewal)", got.Sub(t0))
	}
	// Counting pings to a were last sent at +100ms: its window has
	// closed for sure 2 silences and takeWindow later.
	if got := h.earliestTake(renewed, t0.Add(4100*time.Millisecond)); !got.IsZero() {
		t.Errorf("past the window of the only standby that answered: earliest %v, want none", got.Sub(t0))
	}
	hd := hold{me: "gw1_a", holder: "gw1_a", leaseDuration: 4 * time.Second, margin: 500 * time.Millisecond, renewed: renewed, earliest: h.earliestTake}
	if got := hd.fenceAt(t0); !got.Equal(t0.Add(600 * time.Millisecond)) {
		t.Errorf("fenced at %v, want the earliest take less the margin, +0.6s", got.Sub(t0))
	}
	if v := hd.decide(t0.Add(700*time.Millisecond), true); v != fence {
		t.Errorf("at +0.7s: %v, want fence", v)
	}
	if got := hd.fenceAt(t0.Add(4100 * time.Millisecond)); !got.Equal(renewed.Add(3500 * time.Millisecond)) {
		t.Errorf("no standby could take early: fenced at %v, want the lease duration less the margin", got.Sub(renewed))
	}
}

// The active replica counts its pings to a standby while that standby
// answers, and only probes one that has not answered for a silence.
func TestHeartbeatCountsWhileAnswered(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:1")
	sink, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	h := &Heartbeat{me: "gw1_a", Conn: sink, Silence: 200 * time.Millisecond, log: slog.New(slog.DiscardHandler),
		sent: map[uint64]time.Time{}, standbys: map[netip.AddrPort]*standby{},
		Peers: func() []netip.AddrPort { return []netip.AddrPort{a} }}
	h.ping()
	first := h.standbys[a].counted
	if first.IsZero() {
		t.Fatal("the first ping to a standby never heard did not count")
	}
	h.answeredBy(a, beat{kind: beatAnswer, seq: 1, counts: true})
	h.ping()
	if !h.standbys[a].counted.After(first) {
		t.Fatal("a ping to a standby that just answered did not count")
	}
	counted := h.standbys[a].counted
	time.Sleep(250 * time.Millisecond) // past the silence
	h.ping()
	if !h.standbys[a].counted.Equal(counted) {
		t.Fatal("a ping to a standby silent for a silence counted")
	}
}

func TestBeatRoundTrip(t *testing.T) {
	for _, m := range []beat{
		{kind: beatPing, nonce: 1<<63 + 5, seq: 1, ack: 0, counts: true, from: "gw1_0a1b2c3d"},
		{kind: beatAnswer, nonce: 2, seq: 1 << 40, from: strings.Repeat("n", 253) + "_0a1b2c3d"},
	} {
		got, err := decodeBeat(m.encode())
		if err != nil || got != m {
			t.Errorf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	}
	good := beat{kind: beatPing, nonce: 1, seq: 1, from: "gw1"}.encode()
	badFlags := bytes.Clone(good)
	badFlags[6] = 2
	for name, b := range map[string][]byte{
		"short":          good[:beatHeader-1],
		"not ours":       append([]byte("XXXX"), good[4:]...),
		"version 2":      append(append([]byte("FLHB"), 2), good[5:]...),
		"kind 3":         append(append([]byte("FLHB"), 1, 3), good[6:]...),
		"unknown flags":  badFlags,
		"trailing bytes": append(bytes.Clone(good), 'x'),
		"truncated":      good[:len(good)-1],
		"no identity":    beat{kind: beatPing, nonce: 1, seq: 1}.encode(),
		"numbered 0":     beat{kind: beatPing, nonce: 1, from: "gw1"}.encode(),
	} {
		if _, err := decodeBeat(b); err == nil {
			t.Errorf("%s: decoded, want an error", name)
		}
	}
}

// What another replica sends is decoded or refused, never a panic, and
// what decodes encodes back to the same bytes.
func FuzzDecodeBeat(f *testing.F) {
	f.Add(beat{kind: beatPing, nonce: 1, seq: 2, ack: 1, from: "gw1_00000000"}.encode())
	f.Add(beat{kind: beatAnswer, nonce: 1, seq: 2, from: "gw2"}.encode())
	f.Add([]byte("FLHB"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeBeat(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("%x decoded to %+v, which encodes to %x", b, m, m.encode())
		}
	})
}

// The metric says how long since another replica was last heard: -1
// before the first, then the time since.
func TestHeartbeatHeardMetric(t *testing.T) {
	h := &Heartbeat{me: "gw2_b"}
	c := h.collector()
	if v := testutil.ToFloat64(c); v != -1 {
		t.Fatalf("before any ping: %v, want -1", v)
	}
	h.leaseSeen(heldBy("gw1_a", "1"), time.Now())
	h.pinged(beat{kind: beatPing, nonce: 1, seq: 1, from: "gw1_a"}, time.Now().Add(-2*time.Second))
	if v := testutil.ToFloat64(c); v < 2 || v > 60 {
		t.Fatalf("2 s after a ping: %v, want about 2", v)
	}
}
