package peering

import (
	"log/slog"
	"time"
)

// Step is a milestone of the peering with one peer. Each is logged once
// per membership of the peer (again after it left and came back), at Info
// with the message StepMessage, so a person or a benchmark reading the log
// sees where the time to connect went (docs/peering.md, "Timeline").
type Step string

const (
	// StepJoined: discovery reported the peer alive.
	StepJoined Step = "joined"
	// StepStatementSent: a statement of ours reached the peer's transport.
	StepStatementSent Step = "statement-sent"
	// StepStatementReceived: a statement of the peer's was accepted.
	StepStatementReceived Step = "statement-received"
	// StepViewsAgreed: both directions of views are known here.
	StepViewsAgreed Step = "views-agreed"
	// StepDataPath: a data path holding the peer was applied.
	StepDataPath Step = "data-path"
	// StepHandshake: WireGuard reported a handshake with the peer; the
	// line carries its time as "at", which is earlier than the line.
	StepHandshake Step = "handshake"
	// StepStatus: the peer's state with its views was written where
	// people read it (the Peer object); logged by the Publisher.
	StepStatus Step = "status"
)

// StepMessage is the message of every step's log line.
const StepMessage = "peering step"

// LogStep logs that peer reached step; at, when not zero, is when it did.
func LogStep(log *slog.Logger, step Step, peer string, at time.Time) {
	if at.IsZero() {
		log.Info(StepMessage, "step", string(step), "peer", peer)
		return
	}
	log.Info(StepMessage, "step", string(step), "peer", peer, "at", at)
}

// stepOnce logs step for p unless it was logged during p's membership.
func (e *Engine) stepOnce(p *peer, step Step, at time.Time) {
	if p.steps == nil {
		p.steps = map[Step]bool{}
	}
	if p.steps[step] {
		return
	}
	p.steps[step] = true
	LogStep(e.log, step, p.id, at)
}
