package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Kernel event streams Run keeps open, by the name logs and the
// resubscribes metric give them.
const (
	eventsRoute = "rtnetlink" // routes, rules and links
	eventsNFT   = "nftables"
)

const (
	// resubscribeFirst and resubscribeMax bound the wait before opening a
	// stream that ended again; it doubles while the stream keeps ending.
	resubscribeFirst = 100 * time.Millisecond
	resubscribeMax   = 10 * time.Second
	// streamSettled is how long a stream must stay open for its next end
	// to count as a new trouble.
	streamSettled = 30 * time.Second
	// repairRetryFirst is the first wait before trying a failed repair
	// again; it doubles up to the resync interval.
	repairRetryFirst = 200 * time.Millisecond
)

// stream is one kernel event subscription. A subscription ends on a
// receive error, typically ENOBUFS when events come faster than we read
// them and the kernel drops some. Run opens it again, after a backoff
// while it keeps ending, and reads back everything we own, since events
// were lost.
type stream struct {
	kind string
	// subscribe opens the subscription in the calling thread's network
	// namespace and starts its reader in wg; the reader calls ended once
	// when the stream ends.
	subscribe func(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error

	cancel   context.CancelFunc
	opened   time.Time
	failures int       // ends and failed opens since the stream last settled
	retryAt  time.Time // zero while open
	logged   string    // the trouble last logged, to log once per change
}

type streamEnd struct {
	s   *stream
	err error
}

// Run repairs what someone changes of ours until ctx ends: on route, rule
// and link events (a link set down loses its routes without a route
// event), on nftables events, and every 30 seconds for what no event
// reports. It does nothing until the first Apply. Run works in the
// network namespace of the thread that calls it, and must be called on
// the same one as Apply.
func (f *Fabric) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	ended := make(chan streamEnd)
	streams := []*stream{
		{kind: eventsRoute, subscribe: f.subscribeRoutes},
		{kind: eventsNFT, subscribe: f.subscribeNFT},
	}
	for _, s := range streams {
		if err := f.open(ctx, &wg, s, ended); err != nil {
			return err
		}
	}
	f.log.Debug("watching kernel events", "events", []string{eventsRoute, eventsNFT})
	tick := time.NewTicker(f.resync)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	// A failed repair is tried again after a backoff too: what it waited
	// for (a link's connected route coming back after the link came up)
	// may change with no event of ours.
	again := time.NewTimer(time.Hour)
	defer again.Stop()
	failures := 0
	for {
		retry.Stop()
		if next := nextRetry(streams); !next.IsZero() {
			retry.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return nil
		case e := <-ended:
			f.streamEnded(e.s, e.err)
			continue
		case <-retry.C:
			for _, s := range streams {
				if !s.retryAt.IsZero() && !time.Now().Before(s.retryAt) {
					f.reopen(ctx, &wg, s, ended)
				}
			}
			continue
		case <-f.kick:
		case <-tick.C:
		case <-again.C:
		}
		again.Stop()
		if f.repair() {
			failures = 0
			continue
		}
		again.Reset(min(repairRetryFirst<<min(failures, 16), f.resync))
		failures++
	}
}

// repair brings the kernel back to the last applied Desired and reports
// whether it succeeded.
func (f *Fabric) repair() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.desired == nil {
		return true
	}
	p, err := f.plan(*f.desired)
	var ch changes
	if err == nil {
		ch, err = f.reconcile(p)
	}
	if err != nil {
		if err.Error() != f.failing { // once per change, not per event
			f.log.Warn("fabric repair failed; retrying on the next event", "err", err)
			f.failing = err.Error()
		}
		return false
	}
	if f.failing != "" {
		f.log.Info("fabric repair succeeded after failing")
		f.failing = ""
	}
	if n := ch.total(); n > 0 {
		f.metrics.repairs.Add(float64(n))
		f.log.Info("repaired fabric state", "objects", n, "routes", ch.routesAdded+ch.routesChanged+ch.routesDeleted,
			"rules", ch.rules, "exemption", ch.nft, "overlay", ch.overlay)
	}
	return true
}

// trigger asks Run for a repair.
func (f *Fabric) trigger() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

func (f *Fabric) open(ctx context.Context, wg *sync.WaitGroup, s *stream, ended chan<- streamEnd) error {
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

func (f *Fabric) streamEnded(s *stream, err error) {
	s.cancel()
	if time.Since(s.opened) >= streamSettled {
		s.failures, s.logged = 0, ""
	}
	if err == nil {
		err = errors.New("event channel closed")
	}
	f.troubleOnce(s, "kernel events ended; events may have been lost, resubscribing", err, f.backoff(s))
	f.trigger()
}

func (f *Fabric) reopen(ctx context.Context, wg *sync.WaitGroup, s *stream, ended chan<- streamEnd) {
	if err := f.open(ctx, wg, s, ended); err != nil {
		f.troubleOnce(s, "resubscribing to kernel events failed; retrying", err, f.backoff(s))
		return
	}
	f.metrics.resubscribes.WithLabelValues(s.kind).Inc()
	f.log.Debug("resubscribed to kernel events; reading back what they may have missed", "events", s.kind)
	f.trigger()
}

func (f *Fabric) backoff(s *stream) time.Duration {
	delay := min(resubscribeFirst<<min(s.failures, 16), resubscribeMax)
	s.failures++
	s.retryAt = time.Now().Add(delay)
	return delay
}

func (f *Fabric) troubleOnce(s *stream, msg string, err error, retryIn time.Duration) {
	if err.Error() == s.logged {
		f.log.Debug(msg, "events", s.kind, "err", err, "retryIn", retryIn)
		return
	}
	s.logged = err.Error()
	f.log.Warn(msg, "events", s.kind, "err", err, "retryIn", retryIn)
}

// eventBuffer is the receive buffer size of a kind of stream; 0 keeps
// the default. Tests make it tiny to overflow it.
func (f *Fabric) eventBuffer(kind string) int {
	f.buffersMu.Lock()
	defer f.buffersMu.Unlock()
	return f.buffers[kind]
}

func nextRetry(streams []*stream) time.Time {
	var next time.Time
	for _, s := range streams {
		if !s.retryAt.IsZero() && (next.IsZero() || s.retryAt.Before(next)) {
			next = s.retryAt
		}
	}
	return next
}

// subscribeRoutes reads route, rule, link and neighbour (FDB included)
// events from one rtnetlink socket; the
// vishvananda/netlink library has no rule subscription.
func (f *Fabric) subscribeRoutes(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV4_RULE,
		unix.RTNLGRP_NEIGH)
	if err != nil {
		return err
	}
	if n := f.eventBuffer(eventsRoute); n != 0 {
		if err := s.SetReceiveBufferSize(n, true); err != nil {
			s.Close()
			return err
		}
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		s.Close()
	}()
	go func() {
		defer wg.Done()
		for {
			msgs, _, err := s.Receive()
			if err != nil {
				ended(err)
				return
			}
			for _, m := range msgs {
				if f.concerns(m) {
					f.trigger()
				}
			}
		}
	}()
	return nil
}

// concerns reports whether an rtnetlink event may have changed what we
// own: any route or rule in our table, any change of a link our routes go
// through, any FDB or neighbour entry of our VXLAN link.
func (f *Fabric) concerns(m syscall.NetlinkMessage) bool {
	switch m.Header.Type {
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
		// rtmsg and fib_rule_hdr are both 12 bytes with the table at 4;
		// a table above 255 comes as attribute 15 in both.
		if len(m.Data) < 12 {
			return false
		}
		table := int(m.Data[4])
		if attrs, err := nl.ParseRouteAttr(m.Data[12:]); err == nil {
			for _, a := range attrs {
				if a.Attr.Type == unix.RTA_TABLE && len(a.Value) >= 4 {
					table = int(binary.NativeEndian.Uint32(a.Value))
				}
			}
		}
		return table == f.cfg.Table
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if len(m.Data) < unix.SizeofIfInfomsg {
			return false
		}
		links := f.links.Load()
		return links != nil && (*links)[int(int32(binary.NativeEndian.Uint32(m.Data[4:8])))]
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		// ndmsg: family, 3 bytes of padding, the link's index.
		if len(m.Data) < 8 {
			return false
		}
		vx := f.overlayLink.Load()
		return vx != 0 && int64(int32(binary.NativeEndian.Uint32(m.Data[4:8]))) == vx
	}
	return false
}

// subscribeNFT reports nftables changes that may concern our table.
func (f *Fabric) subscribeNFT(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if n := f.eventBuffer(eventsNFT); n != 0 {
		opts = append(opts, nftables.WithSockOptions(func(c *mdnetlink.Conn) error { return c.SetReadBuffer(n) }))
	}
	// A lasting connection, so that we can close it: the monitor leaves
	// its socket open when it ends on an error.
	conn, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	mon := nftables.NewMonitor(nftables.WithMonitorObject(nftables.MonitorObjectAny), nftables.WithMonitorEventBuffer(256))
	events, err := conn.AddGenerationalMonitor(mon)
	if err != nil {
		conn.CloseLasting()
		return err
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		conn.CloseLasting()
	}()
	go func() {
		defer wg.Done()
		var last error
		for evs := range events {
			if evs.GeneratedBy.Error != nil {
				last = evs.GeneratedBy.Error
				continue
			}
			for _, ev := range evs.Changes {
				if ev.Error != nil || f.nftEventMayBeOurs(ev) {
					f.trigger()
					break
				}
			}
		}
		ended(last)
	}()
	return nil
}

// nftEventMayBeOurs reports whether a change may concern our table. Set
// element events do not name their table, so every one may; reading our
// small table back costs little, and a repair that finds nothing to do
// writes nothing.
func (f *Fabric) nftEventMayBeOurs(ev *nftables.MonitorEvent) bool {
	switch d := ev.Data.(type) {
	case *nftables.Table:
		return d.Name == f.cfg.NFTable
	case *nftables.Chain:
		return d.Table != nil && d.Table.Name == f.cfg.NFTable
	case *nftables.Rule:
		return d.Table != nil && d.Table.Name == f.cfg.NFTable
	case *nftables.Set:
		return d.Table != nil && d.Table.Name == f.cfg.NFTable
	case []nftables.SetElement:
		return true
	}
	return false
}
