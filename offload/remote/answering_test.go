package remote

import (
	"errors"
	"testing"
)

// A provider that fails after answering, fails again, then answers is
// two changes: the repeat is not news.
func TestAnsweringReportsChangesOnly(t *testing.T) {
	var a Answering
	down := errors.New("connection refused")
	for i, step := range []struct {
		err     error
		changed bool
	}{
		{nil, false},  // answering from the start
		{down, true},  // it stops
		{down, false}, // still down
		{nil, true},   // back
	} {
		if got := a.Report(step.err); got != step.changed {
			t.Errorf("step %d: Report(%v) = %v, want %v", i, step.err, got, step.changed)
		}
		if !errors.Is(a.Err(), step.err) {
			t.Errorf("step %d: Err() = %v, want %v", i, a.Err(), step.err)
		}
	}
}
