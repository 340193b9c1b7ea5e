package tunnel

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestSettleFirstContacts(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	wait := 100 * time.Millisecond
	cases := []struct {
		name    string
		says    FirstContact
		waited  time.Duration
		peer    wgtypes.Peer
		outcome string // "" = still waiting
	}{
		{"nothing yet", FirstContactGuess, 50 * time.Millisecond, wgtypes.Peer{}, ""},
		{"handshake done", FirstContactGuess, 10 * time.Millisecond, wgtypes.Peer{LastHandshakeTime: now, ReceiveBytes: 148}, "answered"},
		{"nothing came within the wait", FirstContactGuess, wait, wgtypes.Peer{}, "initiated"},
		{"their initiation arrived, no session yet", FirstContactGuess, 5 * time.Second, wgtypes.Peer{ReceiveBytes: 148}, ""},
		{"their initiation arrived, never a session", FirstContactGuess, firstContactLimit, wgtypes.Peer{ReceiveBytes: 148}, "timed out"},
		// wgctrl reports "never" as the Unix epoch, not the zero time.
		{"epoch is never", FirstContactGuess, 50 * time.Millisecond, wgtypes.Peer{LastHandshakeTime: time.Unix(0, 0)}, ""},
		// A peer that says when it holds us is not guessed about: the
		// guess fired while it was still adding us, and both initiated.
		{"peer not ready, past the guess", FirstContactAnnounced, 5 * wait, wgtypes.Peer{}, ""},
		{"peer ready, nothing came", FirstContactReady, 0, wgtypes.Peer{}, "initiated"},
		{"peer ready, its initiation arrived", FirstContactReady, 0, wgtypes.Peer{ReceiveBytes: 148}, ""},
		{"peer ready, handshake done", FirstContactReady, 0, wgtypes.Peer{LastHandshakeTime: now, ReceiveBytes: 148}, "answered"},
		{"peer never ready", FirstContactAnnounced, firstContactLimit, wgtypes.Peer{}, "timed out"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := Key{1}
			tn := &Tunnel{cfg: Config{FirstContactWait: wait}, log: slog.New(slog.DiscardHandler), waiting: map[Key]time.Time{}, peerIDs: map[Key]string{}, contacts: map[Key]FirstContact{k: c.says}}
			tn.metrics = newMetrics(tn)
			tn.waiting[k] = now.Add(-c.waited)
			c.peer.PublicKey = wgtypes.Key(k)
			settled := tn.settleFirstContacts(&wgtypes.Device{Peers: []wgtypes.Peer{c.peer}}, now)
			_, still := tn.waiting[k]
			if settled == still || settled != (c.outcome != "") {
				t.Fatalf("settled %v, still waiting %v; want outcome %q", settled, still, c.outcome)
			}
			if c.outcome != "" {
				if got := testutil.ToFloat64(tn.metrics.firstContacts.WithLabelValues(c.outcome)); got != 1 {
					t.Errorf("first contacts %q: %v, want 1", c.outcome, got)
				}
			}
		})
	}
}

// Only the side with the larger public key waits, so exactly one of two
// peers does.
func TestWaitsForIsAntisymmetric(t *testing.T) {
	a, b := Key{1, 2}, Key{1, 3}
	if !waitsFor(b, a) || waitsFor(a, b) {
		t.Fatalf("waitsFor(b, a) = %v, waitsFor(a, b) = %v; want exactly b to wait", waitsFor(b, a), waitsFor(a, b))
	}
}

// A gateway behind NAT never waits for a peer's first handshake: the
// peer cannot reach it first. Whichever key is larger, it keeps its
// keepalive, which initiates.
func TestBehindNATNeverWaits(t *testing.T) {
	small, large := Key{1}, Key{2}
	for _, mine := range []Key{small, large} {
		theirs := large
		if mine == large {
			theirs = small
		}
		for _, initiates := range []bool{false, true} {
			tn := &Tunnel{pub: mine, waiting: map[Key]time.Time{}}
			p := Peer{PublicKey: theirs, Keepalive: 25 * time.Second, Initiates: initiates}
			tn.holdFirstContact(p, time.Unix(1_800_000_000, 0))
			_, waits := tn.waiting[theirs]
			if want := !initiates && waitsFor(mine, theirs); waits != want {
				t.Errorf("key %v, initiates %v: waits %v, want %v", mine[0], initiates, waits, want)
			}
			if initiates && tn.effective(p).Keepalive != p.Keepalive {
				t.Errorf("key %v: keepalive held back behind NAT", mine[0])
			}
		}
	}
}
