package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/hashicorp/memberlist"
)

// Every user message starts with a kind byte so that later kinds can be
// told apart from peering's; a kind this build does not know is dropped
// and counted.
const (
	kindPeering  byte = 'P'
	kindServices byte = 'S'
)

// MaxMessageLen bounds a message given to Send or accepted from a member.
const MaxMessageLen = 64 << 10

// ErrNotMember is returned by Send when the destination is not an alive
// member of the federation.
var ErrNotMember = errors.New("not an alive member of the federation")

// Reasons a received message is dropped; they label
// flotilla_discovery_messages_dropped_total.
const (
	MsgDropEmpty       = "empty"
	MsgDropUnknownKind = "unknown_kind"
	MsgDropOversized   = "oversized"
	MsgDropNoHandler   = "no_handler"
	// MsgDropExchangeState: what a member sent in a state exchange
	// (joinpush.go) did not decode.
	MsgDropExchangeState = "exchange_state"
)

// Send delivers msg to the member whose cluster ID is to, over a TCP
// connection encrypted with the federation key (memberlist's reliable
// user messages). It returns once the message is written or ctx ends; a
// nil error means the member's agent received it, not that its handler
// acted on it. The peering engine uses Send as its transport.
func (d *Discovery) Send(ctx context.Context, to string, msg []byte) error {
	return d.send(ctx, to, kindPeering, msg)
}

// SendServices delivers msg to to like Send, for the receiver's
// OnServices: the exports of the Multi-Cluster Services API travel beside
// peering's messages, each kind to its own handler.
func (d *Discovery) SendServices(ctx context.Context, to string, msg []byte) error {
	return d.send(ctx, to, kindServices, msg)
}

func (d *Discovery) send(ctx context.Context, to string, kind byte, msg []byte) error {
	if len(msg) > MaxMessageLen {
		return fmt.Errorf("send to %s: message of %d bytes, at most %d", to, len(msg), MaxMessageLen)
	}
	d.mu.Lock()
	var gossip netip.AddrPort
	if m, ok := d.table[to]; ok && m.State == StateAlive {
		gossip = m.Gossip
	}
	closed := d.closed
	d.mu.Unlock()
	switch {
	case d.ml == nil || closed:
		return fmt.Errorf("send to %s: discovery is not running", to)
	case !gossip.IsValid():
		return fmt.Errorf("send to %s: %w", to, ErrNotMember)
	}
	addr := gossip.String()
	node := &memberlist.Node{Name: to, Addr: net.IP(gossip.Addr().AsSlice()), Port: gossip.Port()}
	buf := make([]byte, 0, 1+len(msg))
	buf = append(buf, kind)
	buf = append(buf, msg...)
	// memberlist's send does not take a context; it gives up on its own
	// after TCPTimeout, so the goroutine left behind when ctx ends first
	// does not outlive that.
	errc := make(chan error, 1)
	go func() { errc <- d.ml.SendReliable(node, buf) }()
	select {
	case err := <-errc:
		if err != nil {
			d.metrics.sendFailures.Inc()
			return fmt.Errorf("send to %s at %s: %w", to, addr, err)
		}
		d.metrics.messagesSent.Inc()
		return nil
	case <-ctx.Done():
		d.metrics.sendFailures.Inc()
		return fmt.Errorf("send to %s at %s: %w", to, addr, ctx.Err())
	}
}

// NotifyMsg receives user messages. memberlist may reuse b after the call,
// so the handler gets a copy.
func (g *delegate) NotifyMsg(b []byte) {
	d := g.d()
	if len(b) == 0 {
		d.metrics.messagesDrop.WithLabelValues(MsgDropEmpty).Inc()
		return
	}
	var handler func([]byte)
	switch b[0] {
	case kindSuspected:
		if d.refute != nil {
			select {
			case d.refute <- struct{}{}:
			default: // one is pending
			}
		}
		return
	case kindPeering:
		handler = d.cfg.OnMessage
	case kindServices:
		handler = d.cfg.OnServices
	default:
		d.metrics.messagesDrop.WithLabelValues(MsgDropUnknownKind).Inc()
		return
	}
	switch {
	case len(b)-1 > MaxMessageLen:
		d.metrics.messagesDrop.WithLabelValues(MsgDropOversized).Inc()
	case handler == nil:
		d.metrics.messagesDrop.WithLabelValues(MsgDropNoHandler).Inc()
	default:
		d.metrics.messagesReceived.Inc()
		handler(slices.Clone(b[1:]))
	}
}
