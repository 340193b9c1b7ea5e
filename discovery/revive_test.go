package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// gatedTransport is our transport with a gate on what it receives: while
// shut, every packet and stream that arrives is dropped, as for a member
// whose process stalls while what it sends still goes out.
type gatedTransport struct {
	*transport
	shut    atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
}

// gated returns a Tune that gives the member a gated transport, and the
// gate.
func gated(t testing.TB) (func(*memberlist.Config), *gatedTransport) {
	g := &gatedTransport{
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
	}
	tune := func(c *memberlist.Config) {
		tr, err := newTransport(netip.AddrPortFrom(netip.MustParseAddr(c.BindAddr), uint16(c.BindPort)), testLogger(t), gates{})
		if err != nil {
			t.Fatal(err)
		}
		g.transport = tr
		c.BindPort, c.AdvertisePort = tr.Port(), tr.Port()
		c.Transport = g
		go g.forward()
	}
	return tune, g
}

func (g *gatedTransport) forward() {
	for {
		select {
		case p := <-g.transport.PacketCh():
			if g.shut.Load() {
				continue
			}
			select {
			case g.packets <- p:
			case <-g.done:
				return
			}
		case c := <-g.transport.StreamCh():
			if g.shut.Load() {
				_ = c.Close()
				continue
			}
			select {
			case g.streams <- c:
			case <-g.done:
				_ = c.Close()
				return
			}
		case <-g.done:
			return
		}
	}
}

func (g *gatedTransport) PacketCh() <-chan *memberlist.Packet { return g.packets }
func (g *gatedTransport) StreamCh() <-chan net.Conn           { return g.streams }

func (g *gatedTransport) Shutdown() error {
	close(g.done)
	return g.transport.Shutdown()
}

// A member declared failed while alive is seen alive again by everyone,
// although the dead messages never reached it (here: nobody gossips to a
// dead member, as when the retransmissions run out first): the members
// that hold it failed exchange state with it. Periodic state exchanges
// are off, so nothing else would bring it back.
func TestFalselyFailedMemberIsRevived(t *testing.T) {
	quiet := func(c *memberlist.Config) {
		c.PushPullInterval = 0
		c.GossipToTheDeadTime = 0
	}
	a := startNode(t, nodeOpts{tune: quiet})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}, tune: quiet})
	gate, g := gated(t)
	c := startNode(t, nodeOpts{seeds: []string{a.addr()}, tune: func(mc *memberlist.Config) {
		quiet(mc)
		// The stalled member itself declares nobody dead during the test.
		mc.SuspicionMult = 10000
		gate(mc)
	}})
	waitUntil(t, 30*time.Second, func() error { return allSee(a, b, c) })
	// The follow-up exchange after each join would tell the stalled
	// member of its death: let them all happen first.
	waitUntil(t, 30*time.Second, func() error { return followedUp(a, b, c) })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	aEvents, bEvents := a.d.Subscribe(ctx), b.d.Subscribe(ctx)
	g.shut.Store(true)
	cid := c.id.ClusterID()
	for _, events := range []<-chan Event{aEvents, bEvents} {
		waitForEvent(t, events, Failed, cid)
	}
	// The others piggyback the dead messages on their acks to the stalled
	// member's pings, which would tell it of its death as soon as it
	// listens again: let those run out of retransmissions first (a few
	// gossip rounds of 50 ms). Should the revival's first exchange come
	// meanwhile, it fails and the next one follows.
	time.Sleep(500 * time.Millisecond)
	g.shut.Store(false)
	for _, events := range []<-chan Event{aEvents, bEvents} {
		waitForEvent(t, events, Join, cid)
	}
	waitUntil(t, 30*time.Second, func() error { return allSee(a, b, c) })
}

// followedUp says whether every join of the nodes had its follow-up
// exchange.
func followedUp(nodes ...*testNode) error {
	for _, n := range nodes {
		n.d.cands.mu.Lock()
		for addr, cand := range n.d.cands.table {
			if cand.resync {
				n.d.cands.mu.Unlock()
				return fmt.Errorf("%s: follow-up with %s pending", n.id.ClusterID(), addr)
			}
		}
		n.d.cands.mu.Unlock()
	}
	return nil
}

func allSee(nodes ...*testNode) error {
	for _, n := range nodes {
		var others []*testNode
		for _, o := range nodes {
			if o != n {
				others = append(others, o)
			}
		}
		if err := sees(n, others...); err != nil {
			return err
		}
	}
	return nil
}

// waitForEvent waits up to a minute for an event of kind about member id.
func waitForEvent(t *testing.T, events <-chan Event, kind EventKind, id string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case ev := <-events:
			if ev.Kind == kind && ev.Member.ClusterID == id {
				return
			}
		case <-timeout:
			t.Fatal(fmt.Sprintf("no %s event for %s in a minute", kind, id))
		}
	}
}

// Of the members that see one fail, exactly reviveBy exchange state with
// it, whoever fails and however many members there are: a burst of false
// deaths is not a storm of exchanges.
func TestFewMembersReviveEachFailedMember(t *testing.T) {
	for _, n := range []int{2, 3, 4, 10, 100} {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("c%03d", i)
		}
		for _, failed := range []string{"x", "y", "z"} {
			reviving := 0
			for _, self := range ids {
				d := &Discovery{selfID: self, table: map[string]*Member{}}
				for _, o := range ids {
					if o != self {
						d.table[o] = &Member{ClusterID: o, State: StateAlive}
					}
				}
				d.table[failed] = &Member{ClusterID: failed, State: StateFailed}
				if d.revives(failed) {
					reviving++
				}
			}
			if want := min(n, reviveBy); reviving != want {
				t.Errorf("%d members, %s failed: %d revive it, want %d", n, failed, reviving, want)
			}
		}
	}
}
