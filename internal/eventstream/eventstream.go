// Package eventstream keeps kernel event subscriptions open. A
// subscription ends on a receive error, typically ENOBUFS when events
// come faster than they are read and the kernel drops some; the netlink
// libraries then close it for good. A Watcher opens it again, after a backoff
// while it keeps ending, logs each trouble once, counts each reopening,
// and tells its owner to read back everything, since events were lost.
package eventstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

const (
	// resubscribeFirst and resubscribeMax bound the wait before opening a
	// stream that ended again; it doubles while the stream keeps ending.
	resubscribeFirst = 100 * time.Millisecond
	resubscribeMax   = 10 * time.Second
	// streamSettled is how long a stream must stay open for its next end
	// to count as a new trouble: waited for from the start, and logged.
	streamSettled = 30 * time.Second
)

// Subscribe opens a subscription in the calling thread's network
// namespace and starts its reader in wg; the reader calls ended once when
// the stream ends before ctx does, and everything it started returns
// once ctx ends.
type Subscribe func(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error

// Stream is one kernel event subscription.
type Stream struct {
	Kind      string // names the stream in logs and to Reopened
	Subscribe Subscribe

	cancel   context.CancelFunc // closes the open subscription's socket
	opened   time.Time
	failures int       // ends and failed opens since the stream last settled
	retryAt  time.Time // zero while open
	logged   string    // the trouble last logged, to log once per change
	down     bool      // a trouble was logged and no recovery since
}

// Hooks are how a Watcher reports to its owner, from the goroutine that
// calls Tend.
type Hooks struct {
	Log *slog.Logger
	// Lost is called when a stream ends and again once it is open again:
	// the owner reads back everything the lost events may have reported.
	Lost func()
	// Reopened is called each time a stream of kind is opened again, for
	// the owner's metric.
	Reopened func(kind string)
}

// Watcher keeps streams open. Subscriptions open in the network namespace
// of the calling thread, so the owner's loop, on the thread that called
// Watch, calls Tend whenever Wake is ready: a goroutine of our own could
// run in another namespace, and entering one needs CAP_SYS_ADMIN.
type Watcher struct {
	Hooks
	streams []*Stream
	wake    chan struct{}

	mu    sync.Mutex
	ended []streamEnd // ends not yet tended
	retry *time.Timer // wakes the owner when a stream is due to reopen
	done  bool        // ctx ended: no more retries
}

// streamEnd reports that a stream's subscription ended, and why.
type streamEnd struct {
	s   *Stream
	err error
}

// Watch opens every stream, in wg; everything it starts ends with ctx. It
// fails if a stream cannot be opened; the caller then ends ctx to close
// those opened.
func Watch(ctx context.Context, wg *sync.WaitGroup, streams []*Stream, h Hooks) (*Watcher, error) {
	w := &Watcher{Hooks: h, streams: streams, wake: make(chan struct{}, 1)}
	for _, s := range streams {
		if err := w.open(ctx, wg, s); err != nil {
			return nil, err
		}
	}
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
		if w.retry != nil {
			w.retry.Stop()
		}
	})
	return w, nil
}

// Wake is ready when a stream ended or is due to be opened again.
func (w *Watcher) Wake() <-chan struct{} { return w.wake }

// Tend handles the streams that ended and opens again those due, in the
// calling thread's network namespace.
func (w *Watcher) Tend(ctx context.Context, wg *sync.WaitGroup) {
	w.mu.Lock()
	ended := w.ended
	w.ended = nil
	w.mu.Unlock()
	for _, e := range ended {
		w.streamEnded(e.s, e.err)
	}
	for _, s := range w.streams {
		if !s.retryAt.IsZero() && !time.Now().Before(s.retryAt) {
			w.reopen(ctx, wg, s)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.retry != nil {
		w.retry.Stop()
	}
	if next := w.nextRetry(); !next.IsZero() && !w.done {
		w.retry = time.AfterFunc(time.Until(next), w.signal)
	}
}

func (w *Watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// open subscribes s; its reader's end is tended unless ctx ended first.
func (w *Watcher) open(ctx context.Context, wg *sync.WaitGroup, s *Stream) error {
	sctx, cancel := context.WithCancel(ctx)
	err := s.Subscribe(sctx, wg, func(err error) {
		if sctx.Err() != nil {
			return // closed by us
		}
		w.mu.Lock()
		w.ended = append(w.ended, streamEnd{s, err})
		w.mu.Unlock()
		w.signal()
	})
	if err != nil {
		cancel()
		return fmt.Errorf("subscribe to %s events: %w", s.Kind, err)
	}
	s.cancel, s.opened, s.retryAt = cancel, time.Now(), time.Time{}
	return nil
}

// streamEnded closes what is left of s's subscription and schedules its
// reopening.
func (w *Watcher) streamEnded(s *Stream, err error) {
	s.cancel()
	if time.Since(s.opened) >= streamSettled {
		s.failures, s.logged = 0, ""
	}
	if err == nil {
		err = errors.New("event channel closed")
	}
	w.troubleOnce(s, "kernel events ended; events may have been lost, resubscribing", err, w.backoff(s))
	w.Lost()
}

// reopen subscribes s again and, on success, has everything read back.
func (w *Watcher) reopen(ctx context.Context, wg *sync.WaitGroup, s *Stream) {
	if err := w.open(ctx, wg, s); err != nil {
		w.troubleOnce(s, "resubscribing to kernel events failed; retrying", err, w.backoff(s))
		return
	}
	w.Reopened(s.Kind)
	const msg = "resubscribed to kernel events; reading back what they may have missed"
	if s.down {
		w.Log.Info(msg, "events", s.Kind)
		s.down = false
	} else {
		w.Log.Debug(msg, "events", s.Kind)
	}
	w.Lost()
}

// backoff schedules the next attempt to open s and returns the wait.
func (w *Watcher) backoff(s *Stream) time.Duration {
	delay := min(resubscribeFirst<<min(s.failures, 16), resubscribeMax)
	s.failures++
	s.retryAt = time.Now().Add(delay)
	return delay
}

// troubleOnce logs a stream's trouble when it differs from the last one
// logged; repeats are counted by the owner's Reopened only.
func (w *Watcher) troubleOnce(s *Stream, msg string, err error, retryIn time.Duration) {
	if err.Error() == s.logged {
		w.Log.Debug(msg, "events", s.Kind, "err", err, "retryIn", retryIn)
		return
	}
	s.logged, s.down = err.Error(), true
	w.Log.Warn(msg, "events", s.Kind, "err", err, "retryIn", retryIn)
}

// nextRetry returns the earliest time a closed stream is to be opened
// again; zero if none is.
func (w *Watcher) nextRetry() time.Time {
	var next time.Time
	for _, s := range w.streams {
		if !s.retryAt.IsZero() && (next.IsZero() || s.retryAt.Before(next)) {
			next = s.retryAt
		}
	}
	return next
}
