package offload

import (
	"context"
	"sync"
)

// lifetime is how long a cache runs: from its making until the context
// given to its Start ends. A read of a kind whose informer has not
// synced waits for it; made in an informer's event handler, that wait
// outlived the cache's stop (an informer made after the stop never
// syncs), held the handler, and with it the stop of every informer of
// the cache: an agent stopped while it started hung there. Every read
// is bound by the lifetime and gives up at the stop, whatever its own
// context: a context that can end (a component's) may still be running
// when the cache stops, for the agent stops its components one after
// another, the later-started first.
type lifetime struct {
	ctx   context.Context
	end   context.CancelFunc
	start sync.Once
}

func newLifetime() *lifetime {
	ctx, end := context.WithCancel(context.Background())
	return &lifetime{ctx: ctx, end: end}
}

// started ends the lifetime when ctx, the context of the cache's Start,
// ends.
func (l *lifetime) started(ctx context.Context) {
	l.start.Do(func() { context.AfterFunc(ctx, l.end) })
}

// bound is ctx, ended too when the lifetime ends; release frees what
// ties them.
func (l *lifetime) bound(ctx context.Context) (bounded context.Context, release func()) {
	if ctx == context.Background() || ctx == context.TODO() {
		return l.ctx, noRelease
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

func noRelease() {}
