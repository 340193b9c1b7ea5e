package tunnel

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// watch subscribes to the kernel events that can undo our work and turns
// each relevant one into a reconcile trigger. Events arrive for our own
// changes too; the reconcile that follows finds nothing to do.
func (t *Tunnel) watch(ctx context.Context) error {
	routes := make(chan netlink.RouteUpdate, 256)
	if err := netlink.RouteSubscribeWithOptions(routes, ctx.Done(), netlink.RouteSubscribeOptions{
		ErrorCallback: func(err error) { t.eventError(ctx, "route", err) },
	}); err != nil {
		return fmt.Errorf("subscribe to route events: %w", err)
	}
	links := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(links, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { t.eventError(ctx, "link", err) },
	}); err != nil {
		return fmt.Errorf("subscribe to link events: %w", err)
	}
	mon := nftables.NewMonitor(nftables.WithMonitorObject(nftables.MonitorObjectRuleset), nftables.WithMonitorEventBuffer(256))
	nft, err := nftables.New()
	if err != nil {
		return fmt.Errorf("open nftables monitor: %w", err)
	}
	nftEvents, err := nft.AddMonitor(mon)
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
				t.trigger()
			}
		}
	}()
	go func() {
		for u := range links {
			if u.Attrs().Name == t.cfg.Interface {
				t.trigger()
			}
		}
	}()
	go func() {
		for ev := range nftEvents {
			if ev.Error != nil || t.nftEventIsOurs(ev) {
				t.trigger()
			}
		}
	}()
	return nil
}

func (t *Tunnel) nftEventIsOurs(ev *nftables.MonitorEvent) bool {
	switch d := ev.Data.(type) {
	case *nftables.Table:
		return d.Name == t.cfg.NFTable
	case *nftables.Chain:
		return d.Table != nil && d.Table.Name == t.cfg.NFTable
	case *nftables.Rule:
		return d.Table != nil && d.Table.Name == t.cfg.NFTable
	}
	return false
}

// eventError notes a lost event stream; the resync catches what it missed.
func (t *Tunnel) eventError(ctx context.Context, kind string, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	t.log.Warn("kernel events lost; relying on the periodic resync", "events", kind, "err", err)
	t.trigger()
}
