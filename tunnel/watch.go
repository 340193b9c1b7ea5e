package tunnel

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// watch subscribes to the kernel events that can undo our work and turns
// each relevant one into a repair trigger. Events arrive for our own
// changes too: a deleted route of ours costs a listing of our routes, and
// nftables transactions are told apart by generation (takePending), so our
// own never make the table be read back.
func (t *Tunnel) watch(ctx context.Context) error {
	routes := make(chan netlink.RouteUpdate, 256)
	if err := netlink.RouteSubscribeWithOptions(routes, ctx.Done(), netlink.RouteSubscribeOptions{
		ErrorCallback: func(err error) { t.eventError(ctx, "route", fullRoutes, err) },
	}); err != nil {
		return fmt.Errorf("subscribe to route events: %w", err)
	}
	links := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(links, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { t.eventError(ctx, "link", fullAll, err) },
	}); err != nil {
		return fmt.Errorf("subscribe to link events: %w", err)
	}
	// Every object type: the generation message that closes each
	// transaction must come through.
	mon := nftables.NewMonitor(nftables.WithMonitorObject(nftables.MonitorObjectAny), nftables.WithMonitorEventBuffer(256))
	nft, err := nftables.New()
	if err != nil {
		return fmt.Errorf("open nftables monitor: %w", err)
	}
	nftEvents, err := nft.AddGenerationalMonitor(mon)
	if err != nil {
		return fmt.Errorf("subscribe to nftables events: %w", err)
	}
	go func() {
		<-ctx.Done()
		mon.Close()
	}()

	proto := netlink.RouteProtocol(t.cfg.RouteProtocol)
	go func() {
		for u := range routes {
			if u.Type == unix.RTM_DELROUTE && u.Protocol == proto {
				t.trigger(fullRoutes)
			}
		}
	}()
	go func() {
		for u := range links {
			if u.Attrs().Name == t.cfg.Interface {
				// The reconcile notices a replaced link and reads back
				// what it carried.
				t.trigger(0)
			}
		}
	}()
	go func() {
		for evs := range nftEvents {
			gen, ok := evs.GeneratedBy.Data.(*nftables.GenMsg)
			if evs.GeneratedBy.Error != nil || !ok {
				t.eventError(ctx, "nftables", fullNAT, evs.GeneratedBy.Error)
				continue
			}
			for _, ev := range evs.Changes {
				if ev.Error != nil || t.nftEventMayBeOurs(ev) {
					t.nftChanged(gen.ID)
					break
				}
			}
		}
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

// eventError notes a lost event stream; the repair reads back what it may
// have missed.
func (t *Tunnel) eventError(ctx context.Context, kind string, full scope, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	t.log.Warn("kernel events lost; reading back our objects", "events", kind, "err", err)
	t.trigger(full)
}
