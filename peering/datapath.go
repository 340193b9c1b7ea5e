package peering

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// applyTunnel computes the desired data path and applies it when it
// differs from what was last applied.
func (e *Engine) applyTunnel() {
	now := e.cfg.Now()
	d := tunnel.Desired{Networks: slices.Clone(e.cfg.Networks)}
	for _, p := range e.peers {
		if !e.wanted(p, now) || len(p.myViews) == 0 || !p.theirOK {
			p.configured, p.tunnelErr = time.Time{}, nil
			continue
		}
		tp := tunnel.Peer{ClusterID: p.id, Endpoint: p.hello.Endpoint, Keepalive: e.cfg.Keepalive, FirstContact: firstContact(p.hello),
			Initiates: e.cfg.OutboundOnly}
		if p.member != nil && p.member.OutboundOnly {
			// Its statement's endpoint is a private address: WireGuard
			// learns where it is from its handshakes.
			tp.Endpoint = netip.AddrPort{}
		}
		copy(tp.PublicKey[:], p.hello.WireGuardKey)
		for _, v := range p.myViews {
			tp.Views = append(tp.Views, tunnel.View{Real: v.Remote, As: v.View})
		}
		for _, v := range e.cfg.Ledger.TheirViews(p.id) {
			if slices.Contains(e.cfg.Networks, v.Mine) {
				tp.ViewsOfMe = append(tp.ViewsOfMe, tunnel.View{Real: v.Mine, As: v.Theirs})
			}
		}
		d.Peers = append(d.Peers, tp)
	}
	// Most reconciles change nothing: skip validating and comparing the
	// whole data path then.
	slices.SortFunc(d.Peers, func(a, b tunnel.Peer) int { return strings.Compare(a.ClusterID, b.ClusterID) })
	own := e.cfg.Dataplane.PublicKey() // isolate refuses peers using it
	if e.candidate != nil && e.applyErr == nil && e.candidateKey == own && reflect.DeepEqual(*e.candidate, d) {
		return
	}
	e.candidate, e.candidateKey = &tunnel.Desired{Networks: d.Networks, Peers: slices.Clone(d.Peers)}, own
	d = e.isolate(d)
	for _, tp := range d.Peers {
		if p := e.peers[tp.ClusterID]; p.configured.IsZero() {
			p.configured = now
		}
	}
	slices.SortFunc(d.Peers, func(a, b tunnel.Peer) int { return strings.Compare(a.ClusterID, b.ClusterID) })
	if e.applied != nil && e.applyErr == nil && reflect.DeepEqual(*e.applied, d) {
		return
	}
	start := time.Now()
	err := e.cfg.Dataplane.Apply(e.ctx, d)
	e.metrics.applySeconds.Observe(time.Since(start).Seconds())
	before := errorText(e.applyErr)
	e.applied, e.applyErr = &d, err
	if err != nil {
		e.metrics.applyErrors.Inc()
		// Retried every reconcile; logged when the error changes.
		if err.Error() != before {
			e.log.Error("cannot apply the data path; retrying", "peers", len(d.Peers), "err", err)
		}
		return
	}
	e.log.Info("data path applied", "peers", len(d.Peers), "took", time.Since(start).Round(time.Microsecond))
	for _, tp := range d.Peers {
		e.stepOnce(e.peers[tp.ClusterID], StepDataPath, time.Time{})
	}
	e.appliedSeq.Add(1)
	e.kickStats()
}

// firstContact is what the peer's statement says of its side of the first
// handshake. An older peer says nothing, and the tunnel guesses.
func firstContact(h *Hello) tunnel.FirstContact {
	switch {
	case h.Protocol < protocolTunnelReady:
		return tunnel.FirstContactGuess
	case h.TunnelReady:
		return tunnel.FirstContactReady
	}
	return tunnel.FirstContactAnnounced
}

// isolate keeps one peer's bad contribution (a WireGuard key another peer
// or this cluster uses, views that collide) from failing the whole data
// path: when d does not validate, peers are added one by one and those that
// break it are left out, with the reason on their Peer.
func (e *Engine) isolate(d tunnel.Desired) tunnel.Desired {
	own := e.cfg.Dataplane.PublicKey()
	ok := tunnel.Desired{Networks: d.Networks}
	whole := d.Validate() == nil
	// Peers configured longest first: a newcomer that collides with an
	// established peer (say, by copying its public key) is the one left out.
	since := func(tp tunnel.Peer) time.Time {
		if c := e.peers[tp.ClusterID].configured; !c.IsZero() {
			return c
		}
		return time.Unix(1<<40, 0)
	}
	slices.SortStableFunc(d.Peers, func(a, b tunnel.Peer) int {
		if c := since(a).Compare(since(b)); c != 0 {
			return c
		}
		return strings.Compare(a.ClusterID, b.ClusterID)
	})
	for _, tp := range d.Peers {
		p := e.peers[tp.ClusterID]
		p.tunnelErr = nil
		if tp.PublicKey == own {
			p.tunnelErr = errors.New("announces this cluster's own WireGuard key")
		} else if !whole {
			try := ok
			try.Peers = append(slices.Clone(ok.Peers), tp)
			if err := try.Validate(); err != nil {
				p.tunnelErr = err
			}
		}
		if p.tunnelErr != nil {
			p.configured = time.Time{}
			e.log.Warn("peer left out of the data path", "peer", tp.ClusterID, "err", p.tunnelErr)
			continue
		}
		ok.Peers = append(ok.Peers, tp)
	}
	return ok
}
