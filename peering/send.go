package peering

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"
)

// outgoing is the Hello p should have from us now.
func (e *Engine) outgoing(p *peer) *Hello {
	h := &Hello{
		Protocol: ProtocolVersion, ProtocolMin: ProtocolVersionMin, ProtocolMax: ProtocolVersionMax,
		From: e.self, To: p.id, Name: e.cfg.Name,
		Networks: slices.Clone(e.cfg.Networks), Endpoint: e.cfg.Endpoint, Decision: e.decision(p),
	}
	key := e.cfg.Dataplane.PublicKey()
	h.WireGuardKey = key[:]
	if h.Decision == Accept && len(p.myViews) > 0 {
		for _, v := range p.myViews {
			h.ViewsOfYou = append(h.ViewsOfYou, ViewClaim{Range: v.Remote, As: v.View})
		}
	}
	h.TunnelReady = h.Decision == Accept && !p.configured.IsZero() && p.tunnelErr == nil && e.applyErr == nil
	h.Grant = e.grants[p.id]
	if len(e.cfg.Labels) > 0 { // nil otherwise, as a decoded statement has them
		h.Labels = maps.Clone(e.cfg.Labels)
	}
	return h
}

// send seals and sends a new Hello for p when its content changed. With
// again, it also sends the current one when nothing changed: to a member
// that just appeared, or in answer to a new statement. Reconciles, which
// run after every input, must not resend: a duplicate received would
// trigger a reconcile that resends, a loop across the federation.
func (e *Engine) send(p *peer, again bool) {
	if p.member == nil || !p.member.Alive {
		return
	}
	h := e.outgoing(p)
	if p.out != nil {
		prev := *p.out
		prev.Generation = 0
		if reflect.DeepEqual(&prev, h) {
			if again {
				e.post(p, p.outMsg)
			}
			return
		}
	}
	g, err := e.nextGeneration()
	if err != nil {
		if err.Error() != e.issueErr {
			e.issueErr = err.Error()
			e.log.Error("cannot issue a new statement; retrying while it fails (is the state directory's disk full?)", "err", err)
		}
		return
	}
	if e.issueErr != "" {
		e.issueErr = ""
		e.log.Info("statements issued again")
	}
	h.Generation = g
	msg, err := Seal(h, e.cfg.Identity)
	if err != nil {
		e.log.Error("cannot seal a statement", "peer", p.id, "err", err)
		return
	}
	unsealed := *h
	unsealed.Generation = 0
	p.out, p.outMsg = &unsealed, msg
	e.metrics.sent.Inc()
	e.post(p, msg)
}

func (e *Engine) resendAll() {
	for _, p := range e.peers {
		if p.outMsg != nil && p.member != nil && p.member.Alive {
			e.post(p, p.outMsg)
		}
	}
}

// post hands msg to p's sender, starting one when p has none.
func (e *Engine) post(p *peer, msg []byte) {
	if p.sender == nil {
		p.sender = e.startSender(p.id)
	}
	p.sender.post(msg)
}

func (e *Engine) stopSender(p *peer) {
	if p.sender != nil {
		p.sender.cancel()
		p.sender = nil
	}
}

// sender delivers messages to one peer from its own goroutine, so a slow
// member delays no other; it keeps only the newest message pending.
type sender struct {
	wake    chan struct{}
	mu      sync.Mutex
	pending []byte
	cancel  context.CancelFunc
}

// startSender starts the goroutine of a sender to id; it ends when the
// sender is stopped or the engine stops, and Run waits for it.
func (e *Engine) startSender(id string) *sender {
	ctx, cancel := context.WithCancel(e.ctx)
	s := &sender{wake: make(chan struct{}, 1), cancel: cancel}
	e.sendersAlive.Add(1)
	e.senders.Go(func() {
		defer e.sendersAlive.Add(-1)
		delivered := false // a sender lives for one membership
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			}
			s.mu.Lock()
			msg := s.pending
			s.pending = nil
			s.mu.Unlock()
			if msg == nil {
				continue
			}
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			err := e.cfg.Transport.Send(sctx, id, msg)
			scancel()
			if err != nil && ctx.Err() == nil {
				e.metrics.sendErrors.Inc()
				e.log.Debug("send to peer failed; will resend", "peer", id, "err", err)
			}
			if err == nil && !delivered {
				delivered = true
				LogStep(e.log, StepStatementSent, id, time.Time{})
			}
		}
	})
	return s
}

func (s *sender) post(msg []byte) {
	s.mu.Lock()
	s.pending = msg
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
