package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// inbox collects the messages a member's OnMessage receives.
type inbox chan []byte

func newInbox() inbox { return make(inbox, 16) }

func (in inbox) handler(msg []byte) {
	select {
	case in <- msg:
	default:
	}
}

func (in inbox) next(t *testing.T, within time.Duration) []byte {
	t.Helper()
	select {
	case msg := <-in:
		return msg
	case <-time.After(within):
		t.Fatalf("no message within %s", within)
		return nil
	}
}

func (in inbox) none(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case msg := <-in:
		t.Fatalf("unexpected message %q", msg)
	case <-time.After(within):
	}
}

func TestSendDeliversBetweenMembersOnly(t *testing.T) {
	inA, inB, inX := newInbox(), newInbox(), newInbox()
	a := startNode(t, nodeOpts{onMessage: inA.handler})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}, onMessage: inB.handler})
	otherKey := bytes.Repeat([]byte{0x99}, 32)
	x := startNode(t, nodeOpts{keys: [][]byte{otherKey}, seeds: []string{a.addr()}, onMessage: inX.handler})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	waitUntil(t, 20*time.Second, func() error { return sees(b, a) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Both ways, byte for byte.
	if err := a.d.Send(ctx, b.id.ClusterID(), []byte("hello b")); err != nil {
		t.Fatalf("a to b: %v", err)
	}
	if got := inB.next(t, 5*time.Second); string(got) != "hello b" {
		t.Errorf("b got %q", got)
	}
	big := bytes.Repeat([]byte{0xfe}, 40000)
	if err := b.d.Send(ctx, a.id.ClusterID(), big); err != nil {
		t.Fatalf("b to a: %v", err)
	}
	if got := inA.next(t, 5*time.Second); !bytes.Equal(got, big) {
		t.Errorf("a got %d bytes, want the 40000 sent", len(got))
	}
	if got := metricValue(t, a.reg, "flotilla_discovery_messages_received_total"); got != 1 {
		t.Errorf("a counted %v received messages, want 1", got)
	}

	// Nobody sends to or receives from a cluster outside the federation.
	for _, tt := range []struct {
		name     string
		from     *testNode
		to       string
		want     error
		wantText string
	}{
		{"member to outsider", a, x.id.ClusterID(), ErrNotMember, "not an alive member"},
		{"outsider to member", x, a.id.ClusterID(), ErrNotMember, "not an alive member"},
		{"to itself", a, a.id.ClusterID(), ErrNotMember, "not an alive member"},
		{"to an unknown ID", a, mustIdentity(t).ClusterID(), ErrNotMember, "not an alive member"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.from.d.Send(ctx, tt.to, []byte("psst"))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tt.to)) {
				t.Errorf("error %q does not name the destination", err)
			}
		})
	}
	if err := a.d.Send(ctx, b.id.ClusterID(), make([]byte, MaxMessageLen+1)); err == nil {
		t.Error("an oversized message was sent")
	}

	// The outsider addresses a member directly, bypassing membership: the
	// member cannot decrypt it and its handler never runs. A member of
	// the federation sending an unknown kind the same way is counted.
	rawSend(t, x.d, a, append([]byte{kindPeering}, "intrusion"...))
	rawSend(t, b.d, a, []byte("Zfuture kind"))
	waitUntil(t, 5*time.Second, func() error {
		if got := metricValue(t, a.reg, "flotilla_discovery_messages_dropped_total", "reason="+MsgDropUnknownKind); got != 1 {
			return fmt.Errorf("unknown kinds dropped = %v, want 1", got)
		}
		return nil
	})
	inA.none(t, 500*time.Millisecond)
	inX.none(t, 0)
}

// rawSend writes a user message from one node's memberlist straight to
// another's gossip address.
func rawSend(t *testing.T, from *Discovery, to *testNode, msg []byte) {
	t.Helper()
	host, port, _ := net.SplitHostPort(to.addr())
	var p int
	fmt.Sscan(port, &p)
	node := &memberlist.Node{Name: to.id.ClusterID(), Addr: net.ParseIP(host), Port: uint16(p)}
	// The write may succeed or be reset; what matters is what the
	// receiver does with it.
	_ = from.ml.SendReliable(node, msg)
}

// Each kind of message reaches its own handler: the exports of services
// never reach the peering engine, and a member without a services handler
// drops them, counted.
func TestSendServicesReachesItsOwnHandler(t *testing.T) {
	inA, svcA, inB := newInbox(), newInbox(), newInbox()
	a := startNode(t, nodeOpts{onMessage: inA.handler, onServices: svcA.handler})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}, onMessage: inB.handler})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	waitUntil(t, 20*time.Second, func() error { return sees(b, a) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := b.d.SendServices(ctx, a.id.ClusterID(), []byte("exports of b")); err != nil {
		t.Fatalf("b to a: %v", err)
	}
	if got := svcA.next(t, 5*time.Second); string(got) != "exports of b" {
		t.Errorf("a's services handler got %q", got)
	}
	if err := a.d.SendServices(ctx, b.id.ClusterID(), []byte("exports of a")); err != nil {
		t.Fatalf("a to b: %v", err)
	}
	waitUntil(t, 5*time.Second, func() error {
		if got := metricValue(t, b.reg, "flotilla_discovery_messages_dropped_total", "reason="+MsgDropNoHandler); got != 1 {
			return fmt.Errorf("messages without a handler dropped = %v, want 1", got)
		}
		return nil
	})
	inA.none(t, 0)
	inB.none(t, 0)
}
