// Package sourcerate limits what each source address may send: a token
// bucket per address, in a table of bounded size, so that a flood of
// many (spoofed) addresses cannot grow it. Gossip packets, clusterset DNS
// queries and the metrics ports' requests are limited with it.
package sourcerate

import (
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter holds a bucket of Burst tokens, refilled at Rate a second, for
// each source address, and at most Sources of them.
type Limiter struct {
	rate    rate.Limit
	burst   int
	sources int
	// Now is time.Now; tests set it.
	Now func() time.Time

	mu      sync.Mutex
	buckets map[netip.Addr]*rate.Limiter
}

// New returns a Limiter of r a second and burst at once per source
// address, keeping at most sources buckets.
func New(r float64, burst, sources int) *Limiter {
	return &Limiter{rate: rate.Limit(r), burst: burst, sources: max(sources, 1), Now: time.Now,
		buckets: map[netip.Addr]*rate.Limiter{}}
}

// Allow takes a token from from's bucket, and says whether there was one.
func (l *Limiter) Allow(from netip.Addr) bool {
	from = from.Unmap()
	now := l.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[from]
	if b == nil {
		if len(l.buckets) >= l.sources {
			l.forgetIdle(now)
		}
		b = rate.NewLimiter(l.rate, l.burst)
		l.buckets[from] = b
	}
	return b.AllowN(now, 1)
}

// Len is the number of sources with a bucket.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// forgetIdle drops the buckets that are full again (their source sent
// nothing for a while); when that frees less than a quarter of the table
// (many sources at once, spoofed ones), every bucket goes. A forgotten
// source starts with a full burst, which costs less than a table without
// bound or a scan of it for each new source.
func (l *Limiter) forgetIdle(now time.Time) {
	for a, b := range l.buckets {
		if b.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, a)
		}
	}
	if len(l.buckets) > l.sources*3/4 {
		clear(l.buckets)
	}
}
