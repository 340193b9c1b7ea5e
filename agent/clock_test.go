package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// The skew of $FLOTILLA_CLOCK_SKEW moves the agent's clock by that much;
// unset, it is the host's; a value that is no duration is refused with
// the variable's name.
func TestClockFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false},
		{"-5m", -5 * time.Minute, false},
		{"+3m", 3 * time.Minute, false},
		{"five minutes", 0, true},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(clockSkewEnv, tc.env)
			now, skew, err := clockFromEnv()
			if tc.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			got := now()
			after := time.Now()
			if skew != tc.want || got.Before(before.Add(tc.want)) || got.After(after.Add(tc.want)) {
				t.Fatalf("clock reads %s, skew %s, between %s and %s; want a skew of %s", got, skew, before, after, tc.want)
			}
		})
	}
}

type handshakes []tunnel.PeerStatus

func (h handshakes) Apply(context.Context, tunnel.Desired) error { return nil }
func (h handshakes) Status() ([]tunnel.PeerStatus, error)        { return slices.Clone(h), nil }
func (h handshakes) PublicKey() tunnel.Key                       { return tunnel.Key{} }

// With a skewed clock the engine reads the tunnel's handshakes on that
// clock: a handshake just now is just now to it, not minutes away (the
// fault campaign saw every Peer of a skewed site Degraded, NoHandshake).
// A handshake that never happened stays never.
func TestHandshakesOnTheAgentsClock(t *testing.T) {
	t.Setenv(clockSkewEnv, "+5m")
	now, skew, err := clockFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{now: now, skew: skew}
	host := time.Now()
	st, err := a.onAgentClock(handshakes{{ClusterID: "x", LastHandshake: host}, {ClusterID: "y"}}).Status()
	if err != nil {
		t.Fatal(err)
	}
	if age := now().Sub(st[0].LastHandshake); age < 0 || age > time.Minute {
		t.Errorf("a handshake just now is %s old on the agent's clock", age)
	}
	if !st[1].LastHandshake.IsZero() {
		t.Errorf("no handshake became %s", st[1].LastHandshake)
	}
}
