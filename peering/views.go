package peering

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
)

// wanted reports whether p should have views and a tunnel now.
func (e *Engine) wanted(p *peer, now time.Time) bool {
	if p.hello == nil || p.hello.Decision != Accept || e.decision(p) != Accept {
		return false
	}
	if p.member != nil && p.member.Alive {
		return true
	}
	if p.succeededBy != "" {
		return false // its views went to its successor
	}
	return !p.goneSince.IsZero() && now.Sub(p.goneSince) < e.cfg.UnreachableGrace
}

// reconcileViews gives p a view of each of its networks and records its
// views of ours while it is wanted, and releases them to quarantine once
// it is not, writing to the ledger through b (writeLedger).
func (e *Engine) reconcileViews(b ipam.Batch, p *peer, now time.Time) {
	if !e.wanted(p, now) {
		if len(p.myViews) > 0 || len(b.TheirViews(p.id)) > 0 || len(b.Views(p.id)) > 0 {
			if err := b.ReleasePeer(p.id); err != nil {
				// Tried again every reconcile while it fails (a full
				// disk): logged when the error changes.
				if err.Error() != p.releaseErr {
					e.log.Error("cannot release peer views", "peer", p.id, "err", err)
				}
				p.releaseErr = err.Error()
				return
			}
			p.releaseErr = ""
			e.log.Info("views released to quarantine", "peer", p.id, "decision", e.decision(p), "theirDecision", decisionOf(p.hello))
		}
		p.myViews, p.viewsFor, p.theirOK, p.viewsErr, p.viewsRetry = nil, nil, false, nil, time.Time{}
		return
	}
	// Errors that repeat every reconcile are logged when they change.
	before := errorText(p.viewsErr)
	if !e.succeed(b, p, now) {
		p.theirOK = false
		if errorText(p.viewsErr) != before {
			e.log.Info("new identity waits for its old one to be declared dead", "peer", p.id, "why", p.viewsErr)
		}
		return
	}
	// A failed allocation is tried again when the peer's networks or our
	// views change, and otherwise after viewsRetry (pools free up as
	// quarantine expires): not on every reconcile.
	failed := len(p.myViews) == 0 && !p.viewsRetry.IsZero()
	if !slices.Equal(p.viewsFor, p.hello.Networks) || len(p.myViews) == 0 && (!failed || !now.Before(p.viewsRetry)) {
		views, err := b.SyncPeer(p.id, p.hello.Networks)
		if err != nil {
			p.viewsErr = viewsError(p, err)
			p.myViews, p.viewsFor, p.viewsRetry = nil, slices.Clone(p.hello.Networks), now.Add(viewsRetry)
			if errorText(p.viewsErr) != before {
				e.log.Error("cannot give the peer a view", "peer", p.id, "err", p.viewsErr)
			}
		} else {
			p.myViews, p.viewsFor, p.viewsErr, p.viewsRetry = views, slices.Clone(p.hello.Networks), nil, time.Time{}
		}
	}
	if len(p.myViews) == 0 {
		p.theirOK = false
		return // p.viewsErr says why
	}
	if err := e.checkEndpoints(p); err != nil {
		p.viewsErr, p.theirOK = err, false
		return
	}
	agreed := p.theirOK
	p.theirOK = false
	if err := b.KeepTheirViews(p.id, e.cfg.Networks); err != nil {
		p.viewsErr = err
		if err.Error() != before {
			e.log.Error("cannot drop the peer's views of networks no longer announced", "peer", p.id, "err", err)
		}
		return
	}
	if len(p.hello.ViewsOfYou) == 0 {
		return
	}
	for _, mine := range e.cfg.Networks {
		i := slices.IndexFunc(p.hello.ViewsOfYou, func(v ViewClaim) bool { return v.Range == mine })
		if i < 0 {
			// The peer answered an older statement of ours; ours is on its
			// way, so this settles by itself. A peer already agreed keeps
			// its tunnel meanwhile, with the networks it has views of: a
			// node's block coming or going interrupts no other.
			p.theirOK = agreed && p.viewsErr == nil
			return
		}
		if err := b.RecordTheirView(p.id, mine, p.hello.ViewsOfYou[i].As); err != nil {
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

// viewsRetry is how soon a failed allocation of views is tried again when
// nothing changes meanwhile.
const viewsRetry = 30 * time.Second

// viewsError says why p's networks got no views and, when the remap pools
// are the reason, what to set.
func viewsError(p *peer, err error) error {
	var ex *ipam.ExhaustedError
	if !errors.As(err, &ex) {
		return fmt.Errorf("allocate views of %s: %w", p.id, err)
	}
	who := p.id
	if p.hello.Name != "" {
		who = fmt.Sprintf("%s (%s)", p.hello.Name, p.id)
	}
	if ex.Larger {
		return fmt.Errorf("peer %s announces %s, larger than any remap pool (%s): it overlaps a network of this cluster, so it must be remapped, and cannot be; "+
			"have %s announce its nodes' pod blocks instead (its agent's --announce=blocks; the default, auto, does so for pod ranges larger than every pool) "+
			"or use a smaller pod range: %w", who, ex.Range, ex.Pools, who, err)
	}
	return fmt.Errorf("peer %s announces %s, and the remap pools (%s) have no free /%d left for it: it overlaps a network of this cluster, so it must be remapped; "+
		"have %s announce smaller networks (its agent's --announce=blocks), or free views by removing peers: %w", who, ex.Range, ex.Pools, ex.Range.Bits(), who, err)
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
	e.input(func() bool {
		for _, p := range e.peers {
			p.viewsFor = nil
		}
		return true
	})
}

// SetNetworks replaces the networks this cluster announces (the agent
// calls it when its Nodes' pod blocks change). Every alive peer is sent a
// new statement at once; each re-syncs its views of us (releasing those of
// networks no longer announced to quarantine) and answers with its views
// of the new ones, and the data path follows. Networks that stay keep
// their views and their place in the data path meanwhile.
func (e *Engine) SetNetworks(networks []netip.Prefix) error {
	if err := checkNetworks(networks); err != nil {
		return err
	}
	networks = slices.Clone(networks)
	e.input(func() bool {
		if slices.Equal(networks, e.cfg.Networks) {
			return false
		}
		e.log.Info("announced networks changed: renegotiating", "networks", networks, "before", e.cfg.Networks)
		e.cfg.Networks = networks
		return true
	})
	return nil
}

// checkNetworks is what a cluster may announce: at least one network, no
// more than a Hello carries, each a valid range, none overlapping another.
func checkNetworks(networks []netip.Prefix) error {
	if len(networks) == 0 {
		return errors.New("no local networks to announce")
	}
	if len(networks) > MaxNetworks {
		return fmt.Errorf("%d networks to announce, more than the %d a statement carries", len(networks), MaxNetworks)
	}
	for i, n := range networks {
		if err := ipam.CheckRange(n); err != nil {
			return fmt.Errorf("local network %s: %w", n, err)
		}
		for _, m := range networks[:i] {
			if n.Overlaps(m) {
				return fmt.Errorf("local networks %s and %s overlap", m, n)
			}
		}
	}
	return nil
}
