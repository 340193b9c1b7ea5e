package agent

import (
	"context"
	"sync"
)

// background is a step of the start that waits on the API server alone
// (reading the cluster's networks and the federation keyring, checking
// the CRDs), run from the beginning so that the local steps (ledger,
// tunnel) go on meanwhile. It belongs to the start: wait takes its result
// where the start needs it, and stop, deferred, ends it when the start
// fails first.
type background[T any] struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	value  T
	err    error
}

func startBackground[T any](ctx context.Context, run func(context.Context) (T, error)) *background[T] {
	ctx, cancel := context.WithCancel(ctx)
	b := &background[T]{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		b.value, b.err = run(ctx)
	}()
	return b
}

// wait returns the step's result once it is there.
func (b *background[T]) wait() (T, error) {
	<-b.done
	b.once.Do(b.cancel)
	return b.value, b.err
}

// stop cancels the step and waits for it.
func (b *background[T]) stop() {
	b.once.Do(b.cancel)
	<-b.done
}
