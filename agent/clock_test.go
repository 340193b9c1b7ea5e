package agent

import (
	"testing"
	"time"
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
