package fabric

import (
	"context"
	"encoding/binary"
	"sync"
	"syscall"
	"time"

	"github.com/flotilla-io/flotilla/internal/eventstream"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Kernel event streams Run keeps open, by the name logs and the
// resubscribes metric give them.
const (
	eventsRoute = "rtnetlink" // routes, rules and links
	eventsNFT   = "nftables"
)

// repairRetryFirst is the first wait before trying a failed repair again;
// it doubles up to the resync interval.
const repairRetryFirst = 200 * time.Millisecond

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
	// A kernel event subscription that ends (ENOBUFS: events were lost)
	// is opened again, and everything read back.
	// A transaction whose generation cannot be decoded may have been
	// ours or anyone's: read back, as the tunnel does.
	nft := eventstream.NFTables(f.cfg.NFTable, func() int { return f.eventBuffer(eventsNFT) },
		func(uint32) { f.trigger() }, f.trigger)
	streams := []*eventstream.Stream{
		{Kind: eventsRoute, Subscribe: f.subscribeRoutes},
		{Kind: eventsNFT, Subscribe: nft},
	}
	events, err := eventstream.Watch(ctx, &wg, streams, eventstream.Hooks{
		Log:      f.log,
		Lost:     f.trigger,
		Reopened: func(kind string) { f.metrics.resubscribes.WithLabelValues(kind).Inc() },
	})
	if err != nil {
		return err
	}
	f.running.Store(true)
	defer f.running.Store(false)
	f.log.Debug("watching kernel events", "events", []string{eventsRoute, eventsNFT})
	tick := time.NewTicker(f.resync)
	defer tick.Stop()
	// A failed repair is tried again after a backoff too: what it waited
	// for (a link's connected route coming back after the link came up)
	// may change with no event of ours.
	again := time.NewTimer(time.Hour)
	defer again.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events.Wake():
			events.Tend(ctx, &wg)
			continue
		case read := <-f.inNetns:
			read()
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

// guardReadWait bounds how long a scrape waits for Run to read the
// guard's counters.
const guardReadWait = time.Second

// guardDropped reads the packets the gateway's guard dropped, by hook,
// on Run's goroutine: Run works in the fabric's network namespace, which
// a scrape's goroutine may not be in. Nothing while Run does not run, or
// where there is no guard.
func (f *Fabric) guardDropped() (map[string]uint64, bool) {
	if !f.running.Load() {
		return nil, false
	}
	type counts struct {
		dropped map[string]uint64
		ok      bool
	}
	out := make(chan counts, 1)
	read := func() {
		dropped, ok, err := guardDropped(f.cfg.NFTable)
		if err != nil {
			f.log.Debug("guard's counters not read", "err", err)
		}
		out <- counts{dropped, ok}
	}
	wait := time.NewTimer(guardReadWait)
	defer wait.Stop()
	select {
	case f.inNetns <- read:
	case <-wait.C:
		return nil, false
	}
	c := <-out
	return c.dropped, c.ok
}

// trigger asks Run for a repair.
func (f *Fabric) trigger() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// eventBuffer is the receive buffer size of a kind of stream; 0 keeps
// the default. Tests make it tiny to overflow it.
func (f *Fabric) eventBuffer(kind string) int {
	f.buffersMu.Lock()
	defer f.buffersMu.Unlock()
	return f.buffers[kind]
}

// subscribeRoutes reads route, rule, link, neighbour (FDB included) and
// address events from one rtnetlink socket; the vishvananda/netlink library has no
// rule subscription.
func (f *Fabric) subscribeRoutes(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV4_RULE,
		unix.RTNLGRP_NEIGH, unix.RTNLGRP_IPV4_IFADDR)
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
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		// A removed address takes the routes preferring it as their
		// source with it, and the kernel says nothing of those routes:
		// the host source's address on lo is watched itself. ifaddrmsg:
		// family, prefix length, flags, scope, the link's index.
		if len(m.Data) < unix.SizeofIfAddrmsg {
			return false
		}
		lo := f.hostLink.Load()
		return lo != 0 && int64(binary.NativeEndian.Uint32(m.Data[4:8])) == lo
	}
	return false
}
