package peering

import (
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// stuckStatus is a data plane whose status reads wait while it is held,
// as the tunnel's do while a repair holds its lock.
type stuckStatus struct {
	Dataplane
	mu sync.RWMutex
}

func (s *stuckStatus) Status() ([]tunnel.PeerStatus, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.Dataplane.Status()
}

// A status read of the tunnel that hangs holds up no negotiation: views are
// agreed and the data path applied meanwhile, and once the read returns
// the handshake it saw makes the peer Connected.
func TestStuckTunnelStatusHoldsUpNoNegotiation(t *testing.T) {
	net := &network{}
	stuck := &stuckStatus{}
	stuck.mu.Lock()
	a := newNode(t, net, nodeOptions{dataplane: func(d Dataplane) Dataplane { stuck.Dataplane = d; return stuck }})
	b := newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "a and b configured each other while a's status read hangs", func() error { return connected(a, b) })
	s := inPhase(t, a, b, PhaseNegotiating)
	if !s.ViewsAgreed.OK {
		t.Fatalf("a's state of b %+v: views not agreed", s)
	}
	a.dp.handshake(b.id.ClusterID(), time.Now())
	b.dp.handshake(a.id.ClusterID(), time.Now())
	inPhase(t, b, a, PhaseConnected) // b reads its status: the handshakes are seen
	stuck.mu.Unlock()
	inPhase(t, a, b, PhaseConnected)
}
