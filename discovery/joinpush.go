package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/flotilla-io/flotilla/identity"
)

// Pushing state to the members that joined us.
//
// A member that others join (a seed, an answer to mDNS or DNS-SD) learns
// of each joiner from its join, and each joiner learns from it only who
// had joined before. Agents that start together (a federation restarting
// after an outage, one join token handed to many) all join the same seeds
// within a moment; once joins to a member go quiet, it exchanges state
// with every member that joined it within the settle time, and each of
// them learns in that one exchange of everyone who joined after it,
// instead of at its own follow-up a settle time after its join (see
// candidates.joined), or when gossip brings their alive messages one by
// one.
//
// Each exchange started by a join carries a word saying why
// (LocalState; memberlist's periodic exchanges carry none): a join or an
// introduction, a joiner's follow-up, or one of these pushes. Only joins
// are counted as joiners, and an exchange this member started itself is
// never counted, so a push or a follow-up never brings on another push.
// A push to a member makes its pending follow-up with the pusher
// needless (candidates.pushed). Members that send no word (older agents)
// are never pushed to; they still have their follow-up.

// Why an exchange was started, its state's first byte.
const (
	exchangeJoin   byte = 'j' // a join, or an introduction
	exchangeFollow byte = 'f' // a joiner's follow-up (candidates.joined)
	exchangePush   byte = 'p' // a push to the members that joined us
)

const (
	// pushQuiet is how long joins to us must have stopped before the
	// push, and pushWait the longest a join waits for it while others
	// keep coming.
	pushQuiet = 150 * time.Millisecond
	pushWait  = 500 * time.Millisecond
	// maxPushed bounds the members one push reaches; pushParallel is how
	// many exchanges it runs at once.
	maxPushed    = 256
	pushParallel = 8
)

// encodeExchange is the state this member sends in an exchange started
// for kind.
func encodeExchange(kind byte, self string) []byte {
	return append([]byte{kind}, self...)
}

// decodeExchange reads what another member sent in an exchange: why it
// was started and by whom.
func decodeExchange(buf []byte) (kind byte, id string, err error) {
	if len(buf) < 2 {
		return 0, "", errors.New("exchange state: too short")
	}
	switch kind = buf[0]; kind {
	case exchangeJoin, exchangeFollow, exchangePush:
	default:
		return 0, "", fmt.Errorf("exchange state: unknown kind %q", kind)
	}
	id = string(buf[1:])
	if err := identity.ValidateClusterID(id); err != nil {
		return 0, "", fmt.Errorf("exchange state: %w", err)
	}
	return kind, id, nil
}

// joinPush is the state of the pushes.
type joinPush struct {
	mu sync.Mutex
	// joined is when each member last joined us.
	joined map[string]time.Time
	// first and last are the first and the last join since the last
	// push (first zero: none).
	first, last time.Time
	// dialing counts the exchanges this member started that are under
	// way, by address, pushing the pushes among them, and following
	// the joins' follow-ups.
	dialing              map[string]int
	pushing, following   int
	wake                 chan struct{}
	quiet, wait, settled time.Duration
}

func newJoinPush(settle time.Duration) *joinPush {
	return &joinPush{
		joined: map[string]time.Time{}, dialing: map[string]int{}, wake: make(chan struct{}, 1),
		quiet: pushQuiet, wait: pushWait, settled: settle,
	}
}

// dial notes an exchange this member starts with addr for kind; the
// function it returns notes its end.
func (p *joinPush) dial(addr string, kind byte) (done func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialing[addr]++
	switch kind {
	case exchangePush:
		p.pushing++
	case exchangeFollow:
		p.following++
	}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.dialing[addr]--; p.dialing[addr] <= 0 {
			delete(p.dialing, addr)
		}
		switch kind {
		case exchangePush:
			p.pushing--
		case exchangeFollow:
			p.following--
		}
	}
}

// kind is the word this member sends in an exchange now. Memberlist does
// not say whether an exchange is one this member started: while it
// pushes or follows up, an exchange another member started gets that
// word too, which that member ignores (it started the exchange).
func (p *joinPush) kind() byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pushing > 0:
		return exchangePush
	case p.following > 0:
		return exchangeFollow
	}
	return exchangeJoin
}

// sawJoin notes that member id, at gossip address addr, joined us at now,
// unless this member started the exchange.
func (p *joinPush) sawJoin(id, addr string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dialing[addr] > 0 {
		return
	}
	p.joined[id] = now
	if p.first.IsZero() {
		p.first = now
	}
	p.last = now
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// due is when the next push is due (zero: none is).
func (p *joinPush) due() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first.IsZero() {
		return time.Time{}
	}
	if at := p.last.Add(p.quiet); at.Before(p.first.Add(p.wait)) {
		return at
	}
	return p.first.Add(p.wait)
}

// take returns the members that joined within the settle time before
// now, at most maxPushed, the latest first, and forgets the older ones.
func (p *joinPush) take(now time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.first, p.last = time.Time{}, time.Time{}
	type joiner struct {
		id string
		at time.Time
	}
	var js []joiner
	for id, at := range p.joined {
		if now.Sub(at) >= p.settled {
			delete(p.joined, id)
			continue
		}
		js = append(js, joiner{id, at})
	}
	if len(js) > maxPushed {
		// The latest joined: the earlier ones had their pushes.
		slices.SortFunc(js, func(a, b joiner) int { return a.at.Compare(b.at) })
		js = js[len(js)-maxPushed:]
	}
	ids := make([]string, len(js))
	for i, j := range js {
		ids[i] = j.id
	}
	return ids
}

// pushLoop pushes this member's state to the members that joined it once
// joins go quiet.
func (d *Discovery) pushLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wait <-chan time.Time
		if at := d.push.due(); !at.IsZero() {
			timer.Reset(max(time.Until(at), 0))
			wait = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-d.push.wake:
			continue
		case <-wait:
		}
		if at := d.push.due(); at.IsZero() || time.Now().Before(at) {
			continue
		}
		d.pushToJoiners(ctx, d.push.take(time.Now()))
	}
}

// pushToJoiners exchanges state with the alive members of ids, a few at
// a time. With fewer than two there is nothing to tell: a lone joiner
// had everything this member knew when it joined.
func (d *Discovery) pushToJoiners(ctx context.Context, ids []string) {
	d.mu.Lock()
	addrs := make([]string, 0, len(ids))
	for _, id := range ids {
		if m := d.table[id]; m != nil && m.State == StateAlive && m.Gossip.IsValid() {
			addrs = append(addrs, m.Gossip.String())
		}
	}
	d.mu.Unlock()
	if len(addrs) < 2 {
		return
	}
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(pushParallel)
	var failed atomic.Int32
	for _, addr := range addrs {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			done := d.push.dial(addr, exchangePush)
			defer done()
			d.metrics.pushes.Inc()
			if _, err := d.ml.Join([]string{addr}); err != nil {
				failed.Add(1)
				d.log.Debug("push to a member that joined us failed", "addr", addr, "err", err)
			}
			return nil
		})
	}
	_ = g.Wait()
	d.log.Debug("pushed state to the members that joined us", "members", len(addrs), "failed", failed.Load(), "took", time.Since(start))
}
