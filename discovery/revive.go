package discovery

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"
)

// A member declared failed while it was alive comes back only through its
// own refutation: an alive message with a higher incarnation that must
// reach every member that declared it dead. memberlist ignores a dead
// message older than the member's incarnation, so when the member refuted
// the suspicion but its refutation ran out of retransmissions before the
// timers of some others expired (gossip saturated by a burst of
// suspicions on a starved machine), nothing tells those others: the member
// stays dead for them until a periodic state exchange, every 90 s at 100
// members (seen in BenchmarkDetection: members falsely failed and still
// failed a minute later). So once after a member fails, after a random
// delay, a member that still holds it failed exchanges state with it: a
// live member's state carries its alive entry, which revives it here (or,
// if it never heard of its death, our state makes it refute), and
// memberlist gossips the revival on; a dead one refuses the connection.
// At most reviveTries exchanges are tried, at growing intervals. Only
// reviveBy members do it for each failed member, chosen by rendezvous
// hashing over the members alive (every member computes the same few
// without a word): a burst of false deaths among 100 would otherwise be
// thousands of state exchanges of 30 KB each, on the machine that was too
// busy to answer probes in the first place. The random delay keeps the
// few from exchanging at the same moment.
//
// The first exchange waits reviveAfter: most false deaths are undone by
// the member's own refutation within seconds, and exchanging state with
// each at once cost more than it saved (100 members converging under
// load: 10 to 19 s and 7 to 10 CPU-s with the exchange after 1 to 5 s,
// against 2 to 3.5 s and 2.5 to 4 CPU-s without). What the exchange is
// for, a member stuck failed for a minute and more, it still ends.
const (
	reviveAfter  = 10 * time.Second
	reviveSpread = 5 * time.Second
	// reviveTries bounds the exchanges with a member that stays failed
	// here: dead, or its refutation on its way.
	reviveTries = 3
	reviveBy    = 3
)

type revival struct {
	addr  string
	at    time.Time
	tries int
}

// revivals are the members to exchange state with, by cluster ID.
type revivals struct {
	mu  sync.Mutex
	due map[string]*revival
}

func newRevivals() *revivals { return &revivals{due: map[string]*revival{}} }

// schedule plans an exchange with the failed member id at its gossip
// address, after a random delay.
func (r *revivals) schedule(id, addr string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.due[id] = &revival{addr: addr, at: now.Add(reviveDelay(0))}
}

func reviveDelay(tries int) time.Duration {
	return reviveAfter<<tries + rand.N(reviveSpread)
}

// take removes and returns the revivals due at now.
func (r *revivals) take(now time.Time) map[string]revival {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[string]revival
	for id, v := range r.due {
		if now.Before(v.at) {
			continue
		}
		if out == nil {
			out = map[string]revival{}
		}
		out[id] = *v
		delete(r.due, id)
	}
	return out
}

// retry plans another exchange with id unless it was tried enough.
func (r *revivals) retry(id string, v revival, now time.Time) {
	v.tries++
	if v.tries >= reviveTries {
		return
	}
	v.at = now.Add(reviveDelay(v.tries))
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.due[id]; !ok { // a newer failure planned its own
		r.due[id] = &v
	}
}

// reviveLoop exchanges state with members failed here when their turn
// comes, each in a goroutine of its own: an exchange with a host that is
// gone waits for the TCP timeout.
func (d *Discovery) reviveLoop(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for id, v := range d.revive.take(time.Now()) {
			if !d.failed(id) {
				continue // revived by gossip meanwhile, left or forgotten
			}
			d.goRun(func() { d.reviveOnce(ctx, id, v) })
		}
	}
}

// reviveOnce exchanges state with the failed member id, and plans the
// next exchange unless that revived it.
func (d *Discovery) reviveOnce(ctx context.Context, id string, v revival) {
	_, err := d.ml.Join([]string{v.addr})
	if ctx.Err() != nil {
		return
	}
	revived := !d.failed(id)
	d.log.Debug("exchanged state with a failed member", "member", id, "gossip", v.addr, "try", v.tries+1, "revived", revived, "err", err)
	if !revived {
		d.revive.retry(id, v, time.Now())
	}
}

// revives says whether this member is one of the reviveBy alive members
// (itself included) that exchange state with the failed member id: those
// whose hash with id ranks first.
func (d *Discovery) revives(id string) bool {
	rank := func(member string) uint64 {
		h := fnv.New64a()
		h.Write([]byte(member))
		h.Write([]byte{0})
		h.Write([]byte(id))
		return h.Sum64()
	}
	mine := rank(d.selfID)
	d.mu.Lock()
	defer d.mu.Unlock()
	before := 0
	for other, m := range d.table {
		if m.State == StateAlive && other != id && rank(other) < mine {
			if before++; before >= reviveBy {
				return false
			}
		}
	}
	return true
}

// failed says whether the member id is held failed (not left).
func (d *Discovery) failed(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.table[id]
	return ok && m.State == StateFailed
}
