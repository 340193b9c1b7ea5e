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
		waited  time.Duration
		peer    wgtypes.Peer
		outcome string // "" = still waiting
	}{
		{"nothing yet", 50 * time.Millisecond, wgtypes.Peer{}, ""},
		{"handshake done", 10 * time.Millisecond, wgtypes.Peer{LastHandshakeTime: now, ReceiveBytes: 148}, "answered"},
		{"nothing came within the wait", wait, wgtypes.Peer{}, "initiated"},
		{"their initiation arrived, no session yet", 5 * time.Second, wgtypes.Peer{ReceiveBytes: 148}, ""},
		{"their initiation arrived, never a session", firstContactLimit, wgtypes.Peer{ReceiveBytes: 148}, "timed out"},
		// wgctrl reports "never" as the Unix epoch, not the zero time.
		{"epoch is never", 50 * time.Millisecond, wgtypes.Peer{LastHandshakeTime: time.Unix(0, 0)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tn := &Tunnel{cfg: Config{FirstContactWait: wait}, log: slog.New(slog.DiscardHandler), waiting: map[Key]time.Time{}, peerIDs: map[Key]string{}}
			tn.metrics = newMetrics(tn)
			k := Key{1}
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
