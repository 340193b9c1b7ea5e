package tunnel

import (
	"context"
	"sync"

	"github.com/flotilla-io/flotilla/internal/eventstream"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernel event streams Run keeps open, by the name logs and the
// resubscribes metric give them.
const (
	eventsRoute     = "route"
	eventsLink      = "link"
	eventsNFT       = "nftables"
	eventsNFTPolicy = "nftables-policy"
)

// streams are the kernel events that can undo our work. Events arrive
// for our own changes too: a deleted route of ours costs a listing of our
// routes, and nftables transactions are told apart by generation
// (takePending), so our own never make the table be read back.
func (t *Tunnel) streams() []*eventstream.Stream {
	nft := eventstream.NFTables(t.cfg.NFTable, func() int { return t.eventBuffer[eventsNFT] },
		t.nftChanged, func() { t.trigger(fullNAT) })
	// The filter table's stream shares the nftables buffer setting.
	policyNFT := eventstream.NFTables(PolicyTable(t.cfg.NFTable), func() int { return t.eventBuffer[eventsNFT] },
		t.policyChanged, func() { t.trigger(fullPolicy) })
	return []*eventstream.Stream{
		{Kind: eventsRoute, Subscribe: t.subscribeRoutes},
		{Kind: eventsLink, Subscribe: t.subscribeLinks},
		{Kind: eventsNFT, Subscribe: nft},
		{Kind: eventsNFTPolicy, Subscribe: policyNFT},
	}
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
