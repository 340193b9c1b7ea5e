package discovery

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"
)

// Source says where a join candidate came from.
type Source string

const (
	SourceMDNS Source = "mdns"
	SourceDNS  Source = "dns"
	SourceSeed Source = "seed"
	// SourceGossip is a member's only source when no candidate is at its
	// address: it was learned through the gossip (it joined us, or other
	// members told of it). It is never a candidate's.
	SourceGossip Source = "gossip"
)

// sourceOrder is the order of Member.Sources.
var sourceOrder = []Source{SourceMDNS, SourceDNS, SourceSeed, SourceGossip}

// settleTime is how long after a join its follow-up comes, and how
// recent a join must be for a push to reach it (joinpush.go).
const settleTime = time.Second

// maxCandidates bounds the candidate table against floods of answers.
const maxCandidates = 1024

// maxMDNSCandidates bounds the candidates only mDNS gave: anyone on the
// LAN can answer a browse, and its answers must not take the places of
// seeds and DNS-SD's.
const maxMDNSCandidates = 256

// maxIntroductions bounds the addresses a new candidate is joined at even
// though it is a member already: in a small federation that saves the
// member the wait for our alive message to be gossiped to it (100 to
// 400 ms on a loaded machine); in a large one gossip carries it, and a
// state exchange with each of hundreds of members would cost more.
const maxIntroductions = 32

// Candidate is an address that may belong to a member.
type Candidate struct {
	Addr     string // host:port
	Sources  []Source
	LastSeen time.Time
	// Failures counts consecutive failed joins; the next try backs off.
	Failures  int
	NextTry   time.Time
	LastError string
	expires   map[Source]time.Time // zero: never (seeds)
	// resync: the next try exchanges state even if the address is a
	// member (the follow-up of a join; see joined).
	resync bool
	// introduce: the address is new and not tried yet; the first try
	// exchanges state even if it is a member already (see add).
	introduce bool
	// resolved are the addresses a host name resolved to when last
	// tried, so a member found by a named seed is matched to it.
	resolved []string
	// pushedAt is when the member here last pushed its state to us
	// (pushed); a push that came while our join was still returning
	// makes its follow-up needless too.
	pushedAt time.Time
}

// candidates is the table of addresses to join and the retry policy.
type candidates struct {
	mu    sync.Mutex
	table map[string]*Candidate
	wake  chan struct{}
	// version counts changes of sources and resolved addresses, so member
	// sources are recomputed only when they may have changed.
	version uint64

	backoffMin, backoffMax, recheck, settle time.Duration
	now                                     func() time.Time
}

func newCandidates(backoffMin, backoffMax time.Duration) *candidates {
	return &candidates{
		table:      make(map[string]*Candidate),
		wake:       make(chan struct{}, 1),
		backoffMin: backoffMin,
		backoffMax: backoffMax,
		recheck:    backoffMax,
		settle:     settleTime,
		now:        time.Now,
	}
}

// add records addr as a candidate from src, valid for ttl (0: forever).
// It reports whether the address is new.
func (c *candidates) add(addr string, src Source, ttl time.Duration) (added bool) {
	now := c.now()
	c.mu.Lock()
	cand, ok := c.table[addr]
	if !ok {
		if len(c.table) >= maxCandidates {
			c.mu.Unlock()
			return false
		}
		cand = &Candidate{Addr: addr, NextTry: now, expires: map[Source]time.Time{}}
		c.table[addr] = cand
		// A member that answers for the first time (mDNS, DNS-SD, a seed)
		// often does not know us yet: it learns of us now, by a direct
		// exchange, rather than when gossip brings our alive message.
		cand.introduce = len(c.table) <= maxIntroductions
	}
	if !slices.Contains(cand.Sources, src) {
		cand.Sources = append(cand.Sources, src)
		c.version++
	}
	cand.LastSeen = now
	if ttl > 0 {
		cand.expires[src] = now.Add(ttl)
	} else {
		cand.expires[src] = time.Time{}
	}
	c.mu.Unlock()
	if !ok {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	return !ok
}

// known reports whether addr is a candidate already.
func (c *candidates) known(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.table[addr]
	return ok
}

// fullFor reports whether a new candidate from src has no place: for
// mDNS, maxMDNSCandidates of them are in the table already.
func (c *candidates) fullFor(src Source) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.table) >= maxCandidates {
		return true
	}
	if src != SourceMDNS {
		return false
	}
	n := 0
	for _, cand := range c.table {
		if slices.Equal(cand.Sources, []Source{SourceMDNS}) {
			n++
		}
	}
	return n >= maxMDNSCandidates
}

// expire forgets sources whose answers were not renewed.
func (c *candidates) expire() {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, cand := range c.table {
		for src, exp := range cand.expires {
			if !exp.IsZero() && now.After(exp) {
				delete(cand.expires, src)
				cand.Sources = slices.DeleteFunc(cand.Sources, func(s Source) bool { return s == src })
				c.version++
			}
		}
		if len(cand.Sources) == 0 {
			delete(c.table, addr)
		}
	}
}

// due returns the candidates whose next try has come.
func (c *candidates) due() []Candidate {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Candidate
	for _, cand := range c.table {
		if !now.Before(cand.NextTry) {
			out = append(out, copyCandidate(cand))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// until is how long until the next candidate is due (0 when one is),
// at most limit.
func (c *candidates) until(limit time.Duration) time.Duration {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	wait := limit
	for _, cand := range c.table {
		wait = min(wait, max(cand.NextTry.Sub(now), 0))
	}
	return wait
}

// result records the outcome of a join to addr. A failure backs off
// exponentially with jitter; a success, or an address that is already a
// member, is checked again after the recheck interval, so a member lost to
// a partition is found again once the partition heals.
func (c *candidates) result(addr string, err error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	cand, ok := c.table[addr]
	if !ok {
		return
	}
	cand.introduce = false
	if err == nil {
		cand.Failures = 0
		cand.LastError = ""
		cand.NextTry = now.Add(c.recheck)
		cand.resync = false
		return
	}
	cand.Failures++
	cand.LastError = err.Error()
	d := c.backoffMin << min(cand.Failures-1, 16)
	if d > c.backoffMax || d <= 0 {
		d = c.backoffMax
	}
	// ±20% jitter so agents that lost the same seed do not retry in step.
	d = time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
	cand.NextTry = now.Add(d)
}

// joined records a join to addr that exchanged state (not a follow-up) and
// schedules one more exchange with it after the settle time. Agents that
// start together (a federation restarting after an outage, one join token
// handed to many) join the same seeds at the same moment, and each learns
// from a seed only who had joined it before; the follow-up picks up
// everyone else in one exchange instead of waiting for their alive
// messages to be gossiped one by one, which takes seconds when a hundred
// of them compete for the same packets. It costs one more state exchange
// per join. since is when the join began: a push from the member since
// then (pushed) was the exchange the follow-up would make, and on a busy
// machine it can come before the join has returned.
func (c *candidates) joined(addr string, since time.Time) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	cand, ok := c.table[addr]
	if !ok {
		return
	}
	cand.Failures = 0
	cand.LastError = ""
	cand.introduce = false
	if !cand.pushedAt.IsZero() && !cand.pushedAt.Before(since) {
		cand.resync = false
		cand.NextTry = now.Add(c.recheck)
		return
	}
	cand.NextTry = now.Add(c.settle)
	cand.resync = true
}

// pushed records a push from the member at addr (joinpush.go): it
// exchanged state with us after our join to it, and does again whenever
// more members join it within the settle time, so a follow-up pending
// with it is not needed.
func (c *candidates) pushed(addr string) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cand := range c.table {
		if cand.Addr != addr && !slices.Contains(cand.resolved, addr) {
			continue
		}
		cand.pushedAt = now
		if cand.resync {
			cand.resync = false
			cand.NextTry = now.Add(c.recheck)
		}
	}
}

// recheckSoon makes every candidate due within a short time; used when a
// member fails, so a heal is noticed quickly.
func (c *candidates) recheckSoon(within time.Duration) {
	t := c.now().Add(within)
	c.mu.Lock()
	for _, cand := range c.table {
		if cand.NextTry.After(t) && cand.Failures == 0 {
			cand.NextTry = t
		}
	}
	c.mu.Unlock()
}

func (c *candidates) list() []Candidate {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Candidate, 0, len(c.table))
	for _, cand := range c.table {
		out = append(out, copyCandidate(cand))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

func copyCandidate(c *Candidate) Candidate {
	out := *c
	out.Sources = slices.Clone(c.Sources)
	out.expires = nil
	out.resolved = nil
	return out
}

// setResolved records what the host name of addr resolved to.
func (c *candidates) setResolved(addr string, resolved []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cand, ok := c.table[addr]; ok && !slices.Equal(cand.resolved, resolved) {
		cand.resolved = resolved
		c.version++
	}
}

func (c *candidates) changes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// sourceIndex maps every candidate address, and every address a named
// candidate resolved to, to the sources that gave it.
func (c *candidates) sourceIndex() map[netip.AddrPort][]Source {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := make(map[netip.AddrPort][]Source)
	add := func(addr string, srcs []Source) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return // a host name: matched by what it resolved to
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		for _, s := range srcs {
			if !slices.Contains(idx[ap], s) {
				idx[ap] = append(idx[ap], s)
			}
		}
	}
	for _, cand := range c.table {
		add(cand.Addr, cand.Sources)
		for _, r := range cand.resolved {
			add(r, cand.Sources)
		}
	}
	return idx
}

// memberSources returns the sources of a member at gossip, in sourceOrder.
func memberSources(idx map[netip.AddrPort][]Source, gossip netip.AddrPort) []Source {
	found := idx[gossip]
	if len(found) == 0 {
		return []Source{SourceGossip}
	}
	out := make([]Source, 0, len(found))
	for _, s := range sourceOrder {
		if slices.Contains(found, s) {
			out = append(out, s)
		}
	}
	return out
}

// refreshSources recomputes every member's sources after candidates
// changed, and tells subscribers of alive members whose sources did.
func (d *Discovery) refreshSources() {
	idx := d.cands.sourceIndex()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.table {
		src := memberSources(idx, m.Gossip)
		if slices.Equal(src, m.Sources) {
			continue
		}
		d.log.Debug("member sources changed", "member", m.ClusterID, "from", m.Sources, "to", src)
		m.Sources = src // replaced, never changed in place: events share it
		if m.State != StateAlive {
			continue
		}
		ev := Event{Kind: Update, Member: *m}
		for s := range d.subs {
			s.publish(ev)
		}
	}
}

// joinLoop tries due candidates that are not already members.
func (d *Discovery) joinLoop(ctx context.Context) {
	// Every 250 ms, or when the next candidate is due if sooner (a
	// follow-up exchange is due a settle time after its join, and waiting
	// for the next tick would add up to a tick to every member's).
	tick := time.NewTimer(0)
	defer tick.Stop()
	var sourcesAt uint64
	for {
		tick.Reset(d.cands.until(250 * time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-d.cands.wake:
		}
		d.cands.expire()
		if v := d.cands.changes(); v != sourcesAt {
			d.refreshSources()
			sourcesAt = v
		}
		d.prune(time.Hour)
		due := d.cands.due()
		if len(due) == 0 {
			continue
		}
		known := d.memberAddrs()
		for _, cand := range due {
			if ctx.Err() != nil {
				return
			}
			member := !cand.resync && d.isKnown(ctx, cand.Addr, known)
			if member && !cand.introduce {
				d.cands.result(cand.Addr, nil)
				continue
			}
			src := cand.Sources[0]
			d.metrics.joins.WithLabelValues(string(src)).Inc()
			kind := exchangeJoin
			if cand.resync {
				kind = exchangeFollow
			}
			done := d.push.dial(cand.Addr, kind)
			since := d.cands.now()
			_, err := d.ml.Join([]string{cand.Addr})
			done()
			switch {
			case err != nil:
				d.metrics.joinFailures.WithLabelValues(string(src)).Inc()
				d.log.Debug("join candidate failed", "addr", cand.Addr, "source", src, "failures", cand.Failures+1, "err", err)
				d.cands.result(cand.Addr, err)
			case cand.resync:
				d.log.Debug("exchanged state again with candidate", "addr", cand.Addr, "source", src)
				d.cands.result(cand.Addr, nil)
			case member:
				// An introduction: we were members together already, and
				// gossip carries whoever joined it after us.
				d.log.Debug("introduced to a member", "addr", cand.Addr, "source", src)
				d.cands.result(cand.Addr, nil)
			default:
				d.log.Debug("joined candidate", "addr", cand.Addr, "source", src)
				d.cands.joined(cand.Addr, since)
			}
		}
	}
}

// isKnown reports whether addr is this agent or an alive member. Host
// names (seeds) are resolved first.
func (d *Discovery) isKnown(ctx context.Context, addr string, known map[string]bool) bool {
	if known[addr] {
		return true
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if net.ParseIP(host) != nil {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupHost(rctx, host)
	if err != nil {
		return false
	}
	resolved := make([]string, 0, len(ips))
	for _, ip := range ips {
		resolved = append(resolved, net.JoinHostPort(ip, port))
	}
	sort.Strings(resolved)
	d.cands.setResolved(addr, resolved)
	return slices.ContainsFunc(resolved, func(a string) bool { return known[a] })
}
