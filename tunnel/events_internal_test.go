package tunnel

import (
	"log/slog"
	"testing"
	"time"
)

// A stream that keeps ending waits twice as long each time, up to
// resubscribeMax; one that stayed open past streamSettled starts over.
func TestResubscribeBackoff(t *testing.T) {
	tun := &Tunnel{log: slog.New(slog.DiscardHandler), kick: make(chan struct{}, 1)}
	s := &stream{kind: eventsRoute, cancel: func() {}}
	var got []time.Duration
	for range 9 {
		s.opened = time.Now()
		tun.streamEnded(s, nil)
		got = append(got, time.Until(s.retryAt).Round(50*time.Millisecond))
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
	s.opened = time.Now().Add(-streamSettled)
	tun.streamEnded(s, nil)
	if d := time.Until(s.retryAt).Round(50 * time.Millisecond); d != resubscribeFirst {
		t.Errorf("wait after a settled stream ended: %s, want %s", d, resubscribeFirst)
	}
}
