package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
)

// stopLog records the order in which components stopped.
type stopLog struct {
	mu    sync.Mutex
	names []string
}

func (l *stopLog) add(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names = append(l.names, name)
}

func (l *stopLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names)
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A component that returns an error fails the agent with that error,
// naming it; stopping then stops every other component, newest first.
func TestComponentFailureStopsTheOthersInReverse(t *testing.T) {
	failed := make(chan error, 4)
	comps := newComponents(quietLog(), func(err error) { failed <- err })
	var stopped stopLog
	steady := func(name string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			<-ctx.Done()
			stopped.add(name)
			return nil
		}
	}
	comps.OnStop("ledger", func() error { stopped.add("ledger"); return nil })
	comps.Go("tunnel repair loop", steady("tunnel repair loop"))
	die := make(chan struct{})
	boom := errors.New("netlink subscription closed")
	comps.Go("engine", func(ctx context.Context) error {
		select {
		case <-die:
			return boom
		case <-ctx.Done():
			return nil
		}
	})
	comps.OnStop("discovery", func() error { stopped.add("discovery"); return errors.New("leave: timeout") })
	comps.Go("member events", steady("member events"))

	close(die)
	err := <-failed
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "engine") {
		t.Fatalf("failure %v, want %v naming the engine", err, boom)
	}
	if err := comps.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	want := []string{"member events", "discovery", "tunnel repair loop", "ledger"}
	if got := stopped.get(); !slices.Equal(got, want) {
		t.Fatalf("stopped %v, want %v", got, want)
	}
	// Stop has waited for every goroutine: a failure report from any of
	// them would be in the channel by now.
	select {
	case err := <-failed:
		t.Fatalf("a component stopped by Stop was reported as failed: %v", err)
	default:
	}
}

// A component that ends without an error before it is stopped has failed
// too: the repair loop or an informer quietly gone is not a clean state.
func TestComponentEndingOnItsOwnIsAFailure(t *testing.T) {
	failed := make(chan error, 1)
	comps := newComponents(quietLog(), func(err error) { failed <- err })
	comps.Go("Peer informer", func(context.Context) error { return nil })
	err := <-failed
	if !strings.Contains(err.Error(), "Peer informer") || !strings.Contains(err.Error(), "stopped on its own") {
		t.Fatalf("failure %q, want one naming the Peer informer", err)
	}
	if err := comps.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Stop is bounded: a component that does not stop by the deadline is
// named, the ones below it are cancelled, and their closers do not run.
func TestStopNamesTheComponentThatHangs(t *testing.T) {
	comps := newComponents(quietLog(), func(error) {})
	var stopped stopLog
	comps.OnStop("ledger", func() error { stopped.add("ledger"); return nil })
	belowCancelled := make(chan struct{})
	comps.Go("tunnel repair loop", func(ctx context.Context) error {
		<-ctx.Done()
		close(belowCancelled)
		return nil
	})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	comps.Go("peering engine", func(context.Context) error {
		<-release // ignores its context
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has passed
	err := comps.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "peering engine did not stop") ||
		!strings.Contains(err.Error(), "not stopped: tunnel repair loop, ledger") {
		t.Fatalf("Stop: %v, want the engine named and the rest listed", err)
	}
	<-belowCancelled
	if got := stopped.get(); len(got) != 0 {
		t.Fatalf("closers ran after the deadline: %v", got)
	}
}
