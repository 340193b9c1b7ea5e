package eventstream

import (
	"context"
	"sync"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
)

// NFTables subscribes to nftables transactions and calls changed with
// the generation of each one that touched, or may have touched, table;
// lost is called for a transaction whose generation did not come
// through (nil: nothing to do, the stream ends next). readBuffer, read at
// each opening, sizes the socket's receive buffer; 0 keeps the default.
func NFTables(table string, readBuffer func() int, changed func(gen uint32), lost func()) Subscribe {
	return func(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
		opts := []nftables.ConnOption{nftables.AsLasting()}
		if n := readBuffer(); n != 0 {
			opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error { return c.SetReadBuffer(n) }))
		}
		// A lasting connection, so that we can close it: the monitor
		// leaves its socket open when it ends on an error.
		conn, err := nftables.New(opts...)
		if err != nil {
			return err
		}
		// Every object type: the generation message that closes each
		// transaction must come through.
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
				gen, ok := evs.GeneratedBy.Data.(*nftables.GenMsg)
				if evs.GeneratedBy.Error != nil || !ok {
					last = evs.GeneratedBy.Error
					if lost != nil {
						lost()
					}
					continue
				}
				for _, ev := range evs.Changes {
					if ev.Error != nil || MayConcern(ev, table) {
						changed(gen.ID)
						break
					}
				}
			}
			ended(last)
		}()
		return nil
	}
}

// MayConcern reports whether an nftables change may concern table. Set
// element events do not name their table, so every one may.
func MayConcern(ev *nftables.MonitorEvent, table string) bool {
	switch d := ev.Data.(type) {
	case *nftables.Table:
		return d.Name == table
	case *nftables.Chain:
		return d.Table != nil && d.Table.Name == table
	case *nftables.Rule:
		return d.Table != nil && d.Table.Name == table
	case *nftables.Set:
		return d.Table != nil && d.Table.Name == table
	case []nftables.SetElement:
		return true
	}
	return false
}
