package e2e

import (
	"fmt"
	"testing"
	"time"
)

// A run of failed tries is lost when the path dropped their packets (the
// next try is answered at once) and held when it queued them (the next
// try's answer comes after the last failed try's deadline).
func TestFlowTellsLostFromHeld(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 7, 17, 13, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// A try every 20 ms from 0 to 3000 ms; tries started in [1000, 1200)
	// fail; the first try after them (1200) is answered after answered ms.
	flowWith := func(answered int) *flow {
		f := &flow{}
		for ms := 0; ms < 3000; ms += 20 {
			switch {
			case ms >= 1000 && ms < 1200:
				f.note(fmt.Sprintf("fail %d dial tcp: i/o timeout", at(ms).UnixNano()))
			case ms == 1200:
				f.note(fmt.Sprintf("ok %d 100.96.0.2 %d", at(ms+answered).UnixNano(), at(ms).UnixNano()))
			default:
				f.note(fmt.Sprintf("ok %d 100.96.0.2 %d", at(ms+2).UnixNano(), at(ms).UnixNano()))
			}
		}
		return f
	}
	for _, tc := range []struct {
		name           string
		answered       int // ms after its start
		lost, heldRuns int
	}{
		{"dropped: the next try answered in 3 ms", 3, 10, 0},
		{"dropped: the next try answered in 500 ms", 500, 10, 0},
		// The last failed try started at 1180: deadline 2180; the next
		// try (1200) answered at 2150 is within the probe's slack.
		{"held: the next try answered after the deadline", 1000, 0, 1},
		{"held: the next try answered at the deadline less the slack", 950, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost, held := flowWith(tc.answered).lostBetween(at(0), at(3000))
			if len(lost) != tc.lost || len(held) != tc.heldRuns {
				t.Errorf("lost %d tries, held runs %v; want %d lost, %d held", len(lost), held, tc.lost, tc.heldRuns)
			}
		})
	}
	t.Run("a failure with no answered try after it is lost", func(t *testing.T) {
		f := &flow{}
		f.note(fmt.Sprintf("ok %d 100.96.0.2 %d", at(2).UnixNano(), at(0).UnixNano()))
		f.note(fmt.Sprintf("fail %d dial tcp: i/o timeout", at(20).UnixNano()))
		if lost, held := f.lostBetween(at(0), at(100)); len(lost) != 1 || len(held) != 0 {
			t.Errorf("lost %v, held %v; want the one failure lost", lost, held)
		}
	})
}
