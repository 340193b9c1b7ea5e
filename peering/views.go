package peering

import (
	"fmt"
	"slices"
	"time"
)

// wanted reports whether p should have views and a tunnel now.
func (e *Engine) wanted(p *peer, now time.Time) bool {
	if p.hello == nil || p.hello.Decision != Accept || e.decision(p) != Accept {
		return false
	}
	if p.member != nil && p.member.Alive {
		return true
	}
	return !p.goneSince.IsZero() && now.Sub(p.goneSince) < e.cfg.UnreachableGrace
}

// reconcileViews gives p a view of each of its networks and records its
// views of ours while it is wanted, and releases them to quarantine once
// it is not.
func (e *Engine) reconcileViews(p *peer, now time.Time) {
	if !e.wanted(p, now) {
		if len(p.myViews) > 0 || len(e.cfg.Ledger.TheirViews(p.id)) > 0 || len(e.cfg.Ledger.Views(p.id)) > 0 {
			if err := e.cfg.Ledger.ReleasePeer(p.id); err != nil {
				e.log.Error("cannot release peer views", "peer", p.id, "err", err)
				return
			}
			e.log.Info("views released to quarantine", "peer", p.id, "decision", e.decision(p), "theirDecision", decisionOf(p.hello))
		}
		p.myViews, p.viewsFor, p.theirOK, p.viewsErr = nil, nil, false, nil
		return
	}
	// Errors that repeat every reconcile are logged when they change.
	before := errorText(p.viewsErr)
	if !slices.Equal(p.viewsFor, p.hello.Networks) || len(p.myViews) == 0 {
		views, err := e.cfg.Ledger.SyncPeer(p.id, p.hello.Networks)
		if err != nil {
			p.viewsErr = fmt.Errorf("allocate views of %s: %w", p.id, err)
			p.myViews, p.viewsFor = nil, nil
			if errorText(p.viewsErr) != before {
				e.log.Error("cannot give the peer a view", "peer", p.id, "err", err)
			}
		} else {
			p.myViews, p.viewsFor, p.viewsErr = views, slices.Clone(p.hello.Networks), nil
		}
	}
	if err := e.checkEndpoints(p); err != nil {
		p.viewsErr, p.theirOK = err, false
		return
	}
	p.theirOK = false
	if len(p.hello.ViewsOfYou) == 0 {
		return
	}
	for _, mine := range e.cfg.Networks {
		i := slices.IndexFunc(p.hello.ViewsOfYou, func(v ViewClaim) bool { return v.Range == mine })
		if i < 0 {
			// The peer answered an older statement of ours; ours is on its
			// way, so this settles by itself.
			return
		}
		if err := e.cfg.Ledger.RecordTheirView(p.id, mine, p.hello.ViewsOfYou[i].As); err != nil {
			p.viewsErr = err
			if err.Error() != before {
				e.log.Warn("inconsistent view claim refused", "peer", p.id, "err", err)
			}
			return
		}
	}
	if p.viewsErr == nil {
		p.theirOK = true
		e.stepOnce(p, StepViewsAgreed, time.Time{})
	}
}

// checkEndpoints refuses to route a peer's range that holds a gateway
// address (ours or another peer's endpoint): WireGuard's own packets would
// go into the tunnel.
func (e *Engine) checkEndpoints(p *peer) error {
	for _, v := range p.myViews {
		if v.View.Contains(e.cfg.Endpoint.Addr()) {
			return fmt.Errorf("its range %s (seen as %s) holds this gateway's address %s", v.Remote, v.View, e.cfg.Endpoint.Addr())
		}
		for _, o := range e.peers {
			if o != p && o.hello != nil && v.View.Contains(o.hello.Endpoint.Addr()) {
				return fmt.Errorf("its range %s (seen as %s) holds the gateway address %s of peer %s", v.Remote, v.View, o.hello.Endpoint.Addr(), o.id)
			}
		}
	}
	return nil
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ViewsMoved tells the engine that views changed in the ledger behind its
// back: the agent remapped those that came to overlap a local network. The
// engine reads every peer's views again and applies the data path.
func (e *Engine) ViewsMoved() {
	e.input(func() {
		for _, p := range e.peers {
			p.viewsFor = nil
		}
	})
}
