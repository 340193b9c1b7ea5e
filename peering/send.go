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
	if p.member == nil || !p.member.Alive || e.bothBehindNAT(p) {
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
	p.sender.post(e, msg)
}

func (e *Engine) stopSender(p *peer) {
	if p.sender != nil {
		p.sender.cancel()
		p.sender = nil
		e.sendersAlive.Add(-1)
	}
}

// sender delivers messages to one peer from a goroutine of its own, so a
// slow member delays no other; it keeps only the newest message pending.
// The goroutine runs while there is something to send and ends when
// there is not: at 100 peers, 100 goroutines idle between resends were
// stacks the garbage collector walked at every cycle.
type sender struct {
	id     string
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	pending []byte
	running bool
	// delivered is touched by the running goroutine alone: a sender
	// lives for one membership, whose first delivery is logged.
	delivered bool
}

// startSender makes the sender to id; it is stopped with stopSender or
// when the engine stops, and Run waits for its goroutine.
func (e *Engine) startSender(id string) *sender {
	ctx, cancel := context.WithCancel(e.ctx)
	e.sendersAlive.Add(1)
	return &sender{id: id, ctx: ctx, cancel: cancel}
}

// post makes msg the one to send, starting the goroutine when none runs.
// It is called from the engine's goroutine only, so never after Run
// started waiting for the senders.
func (s *sender) post(e *Engine, msg []byte) {
	s.mu.Lock()
	s.pending = msg
	start := !s.running
	s.running = true
	s.mu.Unlock()
	if start {
		e.senders.Go(func() { s.run(e) })
	}
}

// run sends what is pending until nothing is, or the sender is stopped.
func (s *sender) run(e *Engine) {
	for {
		s.mu.Lock()
		msg := s.pending
		s.pending = nil
		if msg == nil || s.ctx.Err() != nil {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		sctx, scancel := context.WithTimeout(s.ctx, 5*time.Second)
		err := e.cfg.Transport.Send(sctx, s.id, msg)
		scancel()
		if err != nil && s.ctx.Err() == nil {
			e.metrics.sendErrors.Inc()
			e.log.Debug("send to peer failed; will resend", "peer", s.id, "err", err)
		}
		if err == nil && !s.delivered {
			s.delivered = true
			LogStep(e.log, StepStatementSent, s.id, time.Time{})
		}
	}
}
