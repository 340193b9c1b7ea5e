package agent

import (
	"context"
	"errors"
	"testing"
)

// A step of the start run in the background hands its result to wait; stop
// ends one still under way and returns only once it has.
func TestBackgroundStep(t *testing.T) {
	b := startBackground(context.Background(), func(context.Context) (int, error) { return 7, nil })
	if v, err := b.wait(); v != 7 || err != nil {
		t.Fatalf("wait = %d, %v; want 7, nil", v, err)
	}
	b.stop() // after wait: returns at once

	started, ended := make(chan struct{}), false
	b2 := startBackground(context.Background(), func(ctx context.Context) (int, error) {
		close(started)
		<-ctx.Done()
		ended = true
		return 0, ctx.Err()
	})
	<-started
	b2.stop()
	if !ended {
		t.Fatal("stop returned before the step ended")
	}
	if _, err := b2.wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait after stop = %v, want context.Canceled", err)
	}
}
