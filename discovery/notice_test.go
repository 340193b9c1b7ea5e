package discovery

import (
	"context"
	"crypto/cipher"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// A member whose ack to a probe is lost is suspected by the prober; when
// gossip cannot tell it (here: every suspicion of it is dropped on its way
// in, as when the suspicion reaches it too late on a loaded machine), the
// prober's notice makes it announce itself alive before the suspicion
// times out, and the prober never reports it failed. Without the notice
// (dropped too) it is reported failed: the notice is what saved it.
func TestSuspectedMemberIsToldAtOnce(t *testing.T) {
	defer func(d time.Duration) { noticeAfterStart = d }(noticeAfterStart)
	noticeAfterStart = 0
	for _, tc := range []struct {
		name       string
		dropNotice bool
	}{
		{"notice", false},
		{"notice lost", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quiet := func(c *memberlist.Config) {
				c.PushPullInterval = 0 // no state exchange tells it either
				c.DisableTcpPings = true
				c.EnableCompression = false // the filter reads packets
				c.SuspicionMult = 4         // 0.8 s between two members
			}
			a := startNode(t, nodeOpts{tune: quiet})
			f := &lossyTransport{aead: newGossipAEAD(testKey), dropNotice: tc.dropNotice}
			b := startNode(t, nodeOpts{seeds: []string{a.addr()}, tune: func(c *memberlist.Config) {
				quiet(c)
				f.wrap(t, c)
			}})
			waitUntil(t, 30*time.Second, func() error { return allSee(a, b) })
			// The follow-up state exchange after the join would tell b
			// of its suspicion over TCP: let it happen first.
			waitUntil(t, 30*time.Second, func() error { return followedUp(a, b) })
			bid := b.id.ClusterID()
			f.self.Store(&bid)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := a.d.Subscribe(ctx)
			f.dropAcks.Store(1) // the next probe of b fails
			if tc.dropNotice {
				waitForEvent(t, events, Failed, bid)
				return
			}
			// b refuted, then a holds it alive again: the suspicion is over.
			waitUntil(t, 30*time.Second, func() error {
				if metricValue(t, b.reg, "flotilla_discovery_suspicion_refutations_total") < 1 {
					return errors.New("b has not refuted")
				}
				return nil
			})
			waitUntil(t, 30*time.Second, func() error {
				for _, n := range a.d.ml.Members() {
					if n.Name == bid && n.State == memberlist.StateAlive {
						return nil
					}
				}
				return errors.New("a still suspects b")
			})
			for {
				select {
				case ev := <-events:
					if ev.Kind == Failed && ev.Member.ClusterID == bid {
						t.Fatal("a reported b failed although b refuted")
					}
					continue
				default:
				}
				break
			}
		})
	}
}

// lossyTransport is b's transport: it drops the next dropAcks acks it
// sends, every suspicion and death of b it receives and, with dropNotice,
// every notice that b is suspected.
type lossyTransport struct {
	*transport
	aead       cipher.AEAD
	dropNotice bool
	self       atomic.Pointer[string]
	dropAcks   atomic.Int32
	packets    chan *memberlist.Packet
	done       chan struct{}
}

func (l *lossyTransport) wrap(t *testing.T, c *memberlist.Config) {
	tr, err := newTransport(netip.AddrPortFrom(netip.MustParseAddr(c.BindAddr), uint16(c.BindPort)), testLogger(t), gates{})
	if err != nil {
		t.Fatal(err)
	}
	l.transport = tr
	l.packets = make(chan *memberlist.Packet)
	l.done = make(chan struct{})
	c.BindPort, c.AdvertisePort = tr.Port(), tr.Port()
	c.Transport = l
	go l.forward()
}

func (l *lossyTransport) forward() {
	for {
		select {
		case p := <-l.transport.PacketCh():
			if l.drop(p.Buf) {
				continue
			}
			select {
			case l.packets <- p:
			case <-l.done:
				return
			}
		case <-l.done:
			return
		}
	}
}

// drop says whether an incoming packet carries a suspicion or death of b
// (b would refute them: a Failed followed at once by a Join may reach the
// test's subscriber as the Join alone) or a notice to be dropped.
func (l *lossyTransport) drop(buf []byte) bool {
	self := l.self.Load()
	if self == nil {
		return false
	}
	for _, m := range gossipMessages(l.aead, buf) {
		if len(m) > 1 && (m[0] == mlSuspect || m[0] == mlDead) {
			if _, node, ok := incarnationAndNode(m[1:]); ok && node == *self {
				return true
			}
		}
		if l.dropNotice && len(m) == 2 && m[0] == mlUser && m[1] == kindSuspected {
			return true
		}
	}
	return false
}

func (l *lossyTransport) PacketCh() <-chan *memberlist.Packet { return l.packets }

func (l *lossyTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if l.dropAcks.Load() > 0 {
		for _, m := range gossipMessages(l.aead, b) {
			if len(m) > 0 && m[0] == mlAck && l.dropAcks.Add(-1) >= 0 {
				return time.Now(), nil
			}
		}
	}
	return l.transport.WriteToAddress(b, a)
}

func (l *lossyTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return l.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (l *lossyTransport) Shutdown() error {
	close(l.done)
	return l.transport.Shutdown()
}
