package discovery

import (
	"context"
	"net/netip"
	"sync"
	"time"
)

// EventKind says what happened to a member.
type EventKind int

const (
	// Join: the member is alive and its record verified (also sent for every
	// alive member when a subscriber starts).
	Join EventKind = iota + 1
	// Update: the member published a new record, or its sources changed.
	Update
	// Leave: the member left on purpose.
	Leave
	// Failed: the member stopped answering and was declared dead.
	Failed
)

func (k EventKind) String() string {
	switch k {
	case Join:
		return "join"
	case Update:
		return "update"
	case Leave:
		return "leave"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// MemberState is the state of a member as this agent sees it.
type MemberState string

const (
	StateAlive  MemberState = "alive"
	StateLeft   MemberState = "left"
	StateFailed MemberState = "failed"
)

// Member is another cluster in the federation.
type Member struct {
	ClusterID string
	// Gossip is the member's gossip address.
	Gossip netip.AddrPort
	// Sources say what found the member: the sources of the candidates at
	// its gossip address (mdns, dns, seed), or SourceGossip alone when it
	// was learned only through the gossip. An Update follows a change.
	Sources []Source
	State   MemberState
	// Record is the member's last verified record.
	Record Record
	// Since is when State last changed.
	Since time.Time
}

// Event is one change of a member. Events are level-triggered: Join and
// Update mean "the member is alive with this record", Leave and Failed
// mean "the member is gone". A slow subscriber sees only the latest event
// per member (see subscriber).
type Event struct {
	Kind   EventKind
	Member Member
}

// subscriber is one consumer of events. Memberlist calls its event
// delegate with its node lock held, so publishing must never block:
// events queue here, at most one per member (a newer event for the same
// member replaces the queued one, keeping its place), and a goroutine
// hands them to the consumer. Memory is bounded by the number of members;
// nothing is dropped except superseded states.
type subscriber struct {
	out  chan Event
	wake chan struct{}

	mu        sync.Mutex
	pending   map[string]Event
	order     []string
	coalesced func()
}

func newSubscriber(coalesced func()) *subscriber {
	return &subscriber{
		out:       make(chan Event),
		wake:      make(chan struct{}, 1),
		pending:   make(map[string]Event),
		coalesced: coalesced,
	}
}

// publish queues ev without blocking.
func (s *subscriber) publish(ev Event) {
	id := ev.Member.ClusterID
	s.mu.Lock()
	if old, ok := s.pending[id]; ok {
		// The consumer has not seen old: a Join it never saw followed by an
		// Update is still a Join for it.
		if old.Kind == Join && ev.Kind == Update {
			ev.Kind = Join
		}
		s.pending[id] = ev
		s.mu.Unlock()
		if s.coalesced != nil {
			s.coalesced()
		}
		return
	}
	s.pending[id] = ev
	s.order = append(s.order, id)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) next() (Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.order) == 0 {
		return Event{}, false
	}
	id := s.order[0]
	s.order = s.order[1:]
	ev := s.pending[id]
	delete(s.pending, id)
	return ev, true
}

// run delivers queued events until ctx or done ends, then closes out.
func (s *subscriber) run(ctx context.Context, done <-chan struct{}) {
	defer close(s.out)
	for {
		ev, ok := s.next()
		if !ok {
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				return
			case <-done:
				return
			}
		}
		select {
		case s.out <- ev:
		case <-ctx.Done():
			return
		case <-done:
			return
		}
	}
}
