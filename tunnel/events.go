package tunnel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernel event streams Run keeps open, by the name logs and the
// resubscribes metric give them.
const (
	eventsRoute = "route"
	eventsLink  = "link"
	eventsNFT   = "nftables"
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

// stream is one kernel event subscription. A subscription ends on a
// receive error, typically ENOBUFS when events come faster than we read
// them and the kernel drops some; the libraries then close it for good.
// Run opens it again, after a backoff while it keeps ending, and reads
// back everything we own, since events were lost.
type stream struct {
	kind string
	// subscribe opens the subscription and starts its reader in wg; the
	// reader calls ended once when the stream ends before ctx does.
	subscribe func(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error

	cancel   context.CancelFunc // closes the open subscription's socket
	opened   time.Time
	failures int       // ends and failed opens since the stream last settled
	retryAt  time.Time // zero while open
	logged   string    // the trouble last logged, to log once per change
	down     bool      // a trouble was logged and no recovery since
}

// streamEnd reports that a stream's subscription ended, and why.
type streamEnd struct {
	s   *stream
	err error
}

// streams are the kernel events that can undo our work. Events arrive
// for our own changes too: a deleted route of ours costs a listing of our
// routes, and nftables transactions are told apart by generation
// (takePending), so our own never make the table be read back.
func (t *Tunnel) streams() []*stream {
	return []*stream{
		{kind: eventsRoute, subscribe: t.subscribeRoutes},
		{kind: eventsLink, subscribe: t.subscribeLinks},
		{kind: eventsNFT, subscribe: t.subscribeNFT},
	}
}

// open subscribes s; its reader reports the end on ended unless ctx
// ended first.
func (t *Tunnel) open(ctx context.Context, wg *sync.WaitGroup, s *stream, ended chan<- streamEnd) error {
	sctx, cancel := context.WithCancel(ctx)
	err := s.subscribe(sctx, wg, func(err error) {
		if sctx.Err() != nil {
			return // closed by us
		}
		select {
		case ended <- streamEnd{s, err}:
		case <-ctx.Done():
		}
	})
	if err != nil {
		cancel()
		return fmt.Errorf("subscribe to %s events: %w", s.kind, err)
	}
	s.cancel, s.opened, s.retryAt = cancel, time.Now(), time.Time{}
	return nil
}

// streamEnded closes what is left of s's subscription and schedules its
// reopening.
func (t *Tunnel) streamEnded(s *stream, err error) {
	s.cancel()
	if time.Since(s.opened) >= streamSettled {
		s.failures, s.logged = 0, ""
	}
	if err == nil {
		err = errors.New("event channel closed")
	}
	delay := t.backoff(s)
	t.troubleOnce(s, "kernel events ended; events may have been lost, resubscribing", err, delay)
	// Read back now what the lost events may have reported.
	t.trigger(fullAll)
}

// reopen subscribes s again and, on success, has everything read back.
func (t *Tunnel) reopen(ctx context.Context, wg *sync.WaitGroup, s *stream, ended chan<- streamEnd) {
	if err := t.open(ctx, wg, s, ended); err != nil {
		t.troubleOnce(s, "resubscribing to kernel events failed; retrying", err, t.backoff(s))
		return
	}
	t.metrics.resubscribes.WithLabelValues(s.kind).Inc()
	if s.down {
		t.log.Info("resubscribed to kernel events; reading back what they may have missed", "events", s.kind)
		s.down = false
	}
	t.trigger(fullAll)
}

// backoff schedules the next attempt to open s and returns the wait.
func (t *Tunnel) backoff(s *stream) time.Duration {
	delay := resubscribeFirst << min(s.failures, 16)
	delay = min(delay, resubscribeMax)
	s.failures++
	s.retryAt = time.Now().Add(delay)
	return delay
}

// troubleOnce logs a stream's trouble when it differs from the last one
// logged; repeats are counted by the resubscribes metric only.
func (t *Tunnel) troubleOnce(s *stream, msg string, err error, retryIn time.Duration) {
	if err.Error() == s.logged {
		t.log.Debug(msg, "events", s.kind, "err", err, "retryIn", retryIn)
		return
	}
	s.logged, s.down = err.Error(), true
	t.log.Warn(msg, "events", s.kind, "err", err, "retryIn", retryIn)
}

// nextRetry returns the earliest time a closed stream is to be opened
// again; zero if none is.
func nextRetry(streams []*stream) time.Time {
	var next time.Time
	for _, s := range streams {
		if !s.retryAt.IsZero() && (next.IsZero() || s.retryAt.Before(next)) {
			next = s.retryAt
		}
	}
	return next
}

// subscribeRoutes reports deletions of our routes.
func (t *Tunnel) subscribeRoutes(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
	ch := make(chan netlink.RouteUpdate, 256)
	var last error // written by the library's reader before it closes ch
	if err := netlink.RouteSubscribeWithOptions(ch, ctx.Done(), netlink.RouteSubscribeOptions{
		ErrorCallback: func(err error) {
			last = err
			t.trigger(fullRoutes)
		},
		ReceiveBufferSize:      t.eventBuffer[eventsRoute],
		ReceiveBufferForceSize: t.eventBuffer[eventsRoute] != 0,
	}); err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for u := range ch {
			if u.Type == unix.RTM_DELROUTE && t.rt.isOurs(u.Route, int(t.ownLink.Load())) {
				t.trigger(fullRoutes)
			}
		}
		ended(last)
	}()
	return nil
}

// subscribeLinks reports changes to our link: replaced, or set down (which
// takes its routes with it).
func (t *Tunnel) subscribeLinks(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
	ch := make(chan netlink.LinkUpdate, 64)
	var last error
	if err := netlink.LinkSubscribeWithOptions(ch, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			last = err
			t.trigger(fullAll)
		},
		ReceiveBufferSize:      t.eventBuffer[eventsLink],
		ReceiveBufferForceSize: t.eventBuffer[eventsLink] != 0,
	}); err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for u := range ch {
			if u.Attrs().Name == t.cfg.Interface {
				// The reconcile notices a replaced link and reads back
				// what it carried; a link set down lost its routes.
				t.trigger(fullRoutes)
			}
		}
		ended(last)
	}()
	return nil
}

// subscribeNFT reports nftables transactions that touched (or may have
// touched) our table, by generation.
func (t *Tunnel) subscribeNFT(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if n := t.eventBuffer[eventsNFT]; n != 0 {
		opts = append(opts, nftables.WithSockOptions(func(c *mdnetlink.Conn) error { return c.SetReadBuffer(n) }))
	}
	// A lasting connection, so that we can close it: the monitor leaves
	// its socket open when it ends on an error.
	nft, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	// Every object type: the generation message that closes each
	// transaction must come through.
	mon := nftables.NewMonitor(nftables.WithMonitorObject(nftables.MonitorObjectAny), nftables.WithMonitorEventBuffer(256))
	events, err := nft.AddGenerationalMonitor(mon)
	if err != nil {
		nft.CloseLasting()
		return err
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		nft.CloseLasting()
	}()
	go func() {
		defer wg.Done()
		var last error
		for evs := range events {
			gen, ok := evs.GeneratedBy.Data.(*nftables.GenMsg)
			if evs.GeneratedBy.Error != nil || !ok {
				last = evs.GeneratedBy.Error
				t.trigger(fullNAT)
				continue
			}
			for _, ev := range evs.Changes {
				if ev.Error != nil || t.nftEventMayBeOurs(ev) {
					t.nftChanged(gen.ID)
					break
				}
			}
		}
		ended(last)
	}()
	return nil
}

// nftEventMayBeOurs reports whether a change may concern our table. Set
// element events do not name their table, so every one may.
func (t *Tunnel) nftEventMayBeOurs(ev *nftables.MonitorEvent) bool {
	switch d := ev.Data.(type) {
	case *nftables.Table:
		return d.Name == t.cfg.NFTable
	case *nftables.Chain:
		return d.Table != nil && d.Table.Name == t.cfg.NFTable
	case *nftables.Rule:
		return d.Table != nil && d.Table.Name == t.cfg.NFTable
	case *nftables.Set:
		return d.Table != nil && d.Table.Name == t.cfg.NFTable
	case []nftables.SetElement:
		return true
	}
	return false
}
