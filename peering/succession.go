package peering

import (
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
)

// A cluster that lost its state directory comes back under a new identity
// (a new key, so a new cluster ID) with its old name, from its old
// endpoint. Without more, it would get new views here while its old
// identity's views sit an hour in quarantine: its addresses change, and a
// cluster that loses its state often enough runs the remap pools dry (the
// fault campaign's hour did, after 40 new identities). Instead the new
// identity succeeds the old one: the old one's views, and its blocks still
// in quarantine, are handed over (ipam.Ledger.HandOver), so the cluster is
// seen at the addresses it had.
//
// Names are not proven by a key, so succession asks for more than a name:
// the same endpoint, and the old identity no longer alive. A cluster that
// claimed another's name and endpoint would take addresses that lead to
// the other's gateway, where its handshakes fail; an alive cluster never
// loses its views to another.

// successionWait is how long a new identity waits, without views, for an
// old identity of its name at its endpoint to be declared dead (about the
// failure detection time, docs/discovery.md). Should the old one stay
// alive longer, the new one gets views of its own.
const successionWait = 20 * time.Second

// errSuccession says a new identity waits for its predecessor's death.
var errSuccession = errors.New("waiting for the cluster's old identity to be declared dead")

// successor reports whether p may succeed q: the same cluster name, the
// same endpoint, another identity.
func successor(p, q *peer) bool {
	return q != p && p.hello != nil && q.hello != nil && p.hello.Name != "" &&
		q.hello.Name == p.hello.Name && q.hello.Endpoint == p.hello.Endpoint
}

// succeed hands p the views of the old identities it succeeds, when p has
// none in the ledger yet (a new identity). It returns false, with
// p.viewsErr saying why, while p waits for a predecessor still alive.
func (e *Engine) succeed(b ipam.Batch, p *peer, now time.Time) bool {
	if len(p.myViews) > 0 || len(b.Views(p.id)) > 0 {
		return true
	}
	var gone []*peer
	for _, q := range e.peers {
		if !successor(p, q) {
			continue
		}
		if q.member != nil && q.member.Alive {
			if p.successionUntil.IsZero() {
				p.successionUntil = now.Add(successionWait)
			}
			if now.Before(p.successionUntil) {
				p.viewsErr = fmt.Errorf("%w: %s, alive at the same endpoint %s (waiting up to %s)", errSuccession, q.id, q.hello.Endpoint, successionWait)
				return false
			}
			continue
		}
		gone = append(gone, q)
	}
	for _, q := range gone {
		if err := b.HandOver(q.id, p.id); err != nil {
			e.log.Error("cannot hand an old identity's views over to its successor", "peer", p.id, "old", q.id, "err", err)
			continue
		}
		q.succeededBy = p.id
		e.metrics.successions.Inc()
		q.myViews, q.viewsFor, q.theirOK, q.viewsErr, q.viewsRetry = nil, nil, false, nil, time.Time{}
		e.log.Info("views handed over: cluster back under a new identity", "cluster", p.hello.Name, "peer", p.id, "old", q.id)
	}
	if errors.Is(p.viewsErr, errSuccession) {
		p.viewsErr = nil
	}
	return true
}
