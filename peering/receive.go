package peering

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"
)

// receive verifies and records one message. It says whether the message
// was news (a new statement), which the engine then acts on; a resend, a
// refused message or one held for its sender changes nothing yet.
func (e *Engine) receive(msg []byte) bool {
	s, err := Parse(msg)
	if err != nil {
		e.refuse("", err)
		return false
	}
	h := &s.Hello
	if h.To != e.self {
		e.refuse(h.From, fmt.Errorf("%w: for %s", ErrMisdirected, h.To))
		return false
	}
	p, known := e.peers[h.From]
	if !known || p.member == nil {
		// Only members verified by discovery are heard. A message can
		// overtake the member's join event, so it waits (bounded) for it.
		e.holdEarly(h.From, msg)
		return false
	}
	if err := s.Verify(p.member.PublicKey); err != nil {
		e.refuse(h.From, err)
		return false
	}
	if p.hello != nil {
		switch {
		case h.Generation < p.hello.Generation:
			e.refuse(h.From, fmt.Errorf("%w: generation %d, already have %d", ErrReplayed, h.Generation, p.hello.Generation))
			return false
		case h.Generation == p.hello.Generation:
			if !s.SameAs(p.payload) {
				e.refuse(h.From, fmt.Errorf("%w: a different message with generation %d", ErrReplayed, h.Generation))
				return false
			}
			e.metrics.repeated.Inc()
			e.deliverGrant(p) // not yet, if restored from the ledger before its member
			return false      // a resend: nothing else new
		}
	}
	p.hello, p.payload = h, slices.Clone(s.Payload())
	e.metrics.accepted.Inc()
	e.stepOnce(p, StepStatementReceived, time.Time{})
	e.toPersist[p.id] = msg // stored before the reconcile that acts on it
	e.log.Debug("hello accepted", "peer", p.id, "generation", h.Generation, "protocol", h.Protocol, "decision", h.Decision, "views", len(h.ViewsOfYou), "grant", len(h.Grant))
	e.deliverGrant(p)
	// Answer every new statement, so a peer that lost ours recovers now
	// rather than at the next resend.
	e.send(p, true)
	return true
}

// deliverGrant hands the grant in p's last accepted statement to the
// receiver when it differs from the last one handed over. An empty field
// is no news: the grant last delivered stands until the provider sends
// another (a revocation included).
func (e *Engine) deliverGrant(p *peer) {
	if e.cfg.Grants == nil || p.hello == nil || p.member == nil || len(p.hello.Grant) == 0 || bytes.Equal(p.hello.Grant, p.grantDelivered) {
		return
	}
	p.grantDelivered = slices.Clone(p.hello.Grant)
	e.cfg.Grants.GrantReceived(p.id, slices.Clone(p.member.PublicKey), slices.Clone(p.hello.Grant))
}

// Bounds on messages held for senders discovery has not reported yet.
const (
	maxEarly  = 256
	earlyWait = 30 * time.Second
)

type earlyMessage struct {
	msg []byte
	at  time.Time
}

// holdEarly keeps the newest message of a sender that is not a known
// member yet; memberChanged replays it. Old and excess ones are dropped
// and counted.
func (e *Engine) holdEarly(from string, msg []byte) {
	defer func() { e.metrics.held.Set(float64(len(e.early))) }()
	now := e.cfg.Now()
	for id, m := range e.early {
		if now.Sub(m.at) > earlyWait {
			delete(e.early, id)
			e.metrics.refused.WithLabelValues("unknown_sender").Inc()
		}
	}
	if _, ok := e.early[from]; !ok && len(e.early) >= maxEarly {
		e.metrics.refused.WithLabelValues("unknown_sender").Inc()
		return
	}
	e.early[from] = earlyMessage{msg: msg, at: now}
	e.log.Debug("message from a sender not yet known as a member: held", "from", from)
}

func (e *Engine) refuse(from string, err error) {
	reason := "malformed"
	switch {
	case errors.Is(err, ErrIncompatible):
		reason = "incompatible"
	case errors.Is(err, ErrForged):
		reason = "forged"
	case errors.Is(err, ErrReplayed):
		reason = "replayed"
	case errors.Is(err, ErrMisdirected):
		reason = "misdirected"
	}
	e.metrics.refused.WithLabelValues(reason).Inc()
	e.log.Warn("peering message refused", "from", from, "reason", reason, "err", err)
}
