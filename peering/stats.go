package peering

import (
	"context"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// How often the tunnel's status is read. Right after an apply that
// configured a peer its first handshake is a round trip away, so the reads
// start fast and back off; a peer is Connected when a read sees the
// handshake, and a read a second later cost up to a second of every
// pair's convergence.
const (
	statsFirst    = 10 * time.Millisecond
	statsSettling = time.Second     // at most, while a peer is settling
	statsSteady   = 5 * time.Second // otherwise
)

// statsRead is one read of the tunnel's status, taken after the data path
// numbered applied was applied.
type statsRead struct {
	st      []tunnel.PeerStatus
	err     error
	applied uint64
}

// pollStats reads the tunnel's status off the engine's goroutine, which it
// would hold while the tunnel's lock is taken by a repair or an apply, and
// hands each read to it. kickStats restarts the fast reads. It ends with
// ctx; Run waits for it.
func (e *Engine) pollStats(ctx context.Context) {
	wait := statsFirst
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.statsKick:
			wait = statsFirst
		case <-timer.C:
		}
		applied := e.appliedSeq.Load()
		st, err := e.cfg.Dataplane.Status()
		r := statsRead{st: st, err: err, applied: applied}
		select {
		case e.inputs <- func() bool { return e.setStats(r) }:
		case <-ctx.Done():
			return
		}
		// After a kick the reads back off to a second whatever the
		// engine says (it may not have said yet that a peer settles).
		switch {
		case wait < statsSettling:
			wait = min(2*wait, statsSettling)
		case e.settlingNow.Load():
			wait = statsSettling
		default:
			wait = statsSteady
		}
		timer.Reset(wait)
	}
}

// kickStats has the tunnel's status read now and fast again.
func (e *Engine) kickStats() {
	select {
	case e.statsKick <- struct{}{}:
	default:
	}
}

// setStats takes a read of the tunnel's handshakes and endpoints in use. A
// read taken before the last apply may miss what it configured, and is
// dropped: the kick after that apply brings a newer one. It says whether
// it took the read.
func (e *Engine) setStats(r statsRead) bool {
	if r.applied != e.appliedSeq.Load() {
		return false
	}
	if r.err != nil {
		e.log.Debug("tunnel status", "err", r.err)
		return false
	}
	clear(e.stats)
	for _, s := range r.st {
		e.stats[s.ClusterID] = s
		if p, ok := e.peers[s.ClusterID]; ok && !p.configured.IsZero() && !s.LastHandshake.IsZero() {
			e.stepOnce(p, StepHandshake, s.LastHandshake)
		}
	}
	return true
}

// settling reports whether some peer is configured but not yet connected.
func (e *Engine) settling() bool {
	for _, p := range e.peers {
		if !p.configured.IsZero() && e.phase(p) != PhaseConnected {
			return true
		}
	}
	return false
}
