package apiauth

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Cache keeps the answers of reviews (TokenReview, SubjectAccessReview)
// for a while, as a kubelet caches its webhook authenticator's and
// authorizer's: a scrape every few seconds, `kubectl logs -f` on a
// Deployment's pods or a port-forward's connections would otherwise cost
// a review each. An allowed answer is kept TTL; a refusal RefusedTTL,
// shorter, so that a permission just granted works soon. Errors are not
// kept: the next request asks again. At most Size answers are kept, so
// that a caller who cycles tokens or names cannot grow it.
type Cache[K comparable, V any] struct {
	cfg CacheConfig

	mu      sync.Mutex
	entries map[K]cacheEntry[V]
}

// CacheConfig is what a Cache needs.
type CacheConfig struct {
	TTL, RefusedTTL time.Duration
	Size            int
	// Now is time.Now when nil.
	Now func() time.Time
	// Hits and Misses, when set, count the answers found fresh and the
	// reviews asked.
	Hits, Misses prometheus.Counter
}

type cacheEntry[V any] struct {
	value   V
	expires time.Time
}

// NewCache returns an empty Cache.
func NewCache[K comparable, V any](cfg CacheConfig) *Cache[K, V] {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cache[K, V]{cfg: cfg, entries: map[K]cacheEntry[V]{}}
}

// Get answers key from the cache while its answer is fresh, else asks:
// ask returns the answer and whether it allows (which sets how long it is
// kept).
func (c *Cache[K, V]) Get(ctx context.Context, key K, ask func(context.Context) (V, bool, error)) (V, error) {
	c.mu.Lock()
	e, ok := c.entries[key]
	fresh := ok && c.cfg.Now().Before(e.expires)
	c.mu.Unlock()
	if fresh {
		inc(c.cfg.Hits)
		return e.value, nil
	}
	inc(c.cfg.Misses)
	v, allowed, err := ask(ctx)
	if err != nil {
		return v, err
	}
	ttl := c.cfg.RefusedTTL
	if allowed {
		ttl = c.cfg.TTL
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.cfg.Size {
		c.evict(now)
	}
	c.entries[key] = cacheEntry[V]{value: v, expires: now.Add(ttl)}
	return v, nil
}

// Forget drops key's answer: the next Get asks again. For an owner that
// learnt the answer changed (a watch refused).
func (c *Cache[K, V]) Forget(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// Len is the number of answers kept.
func (c *Cache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// evict makes room for one answer: the expired go, else the one that
// expires first.
func (c *Cache[K, V]) evict(now time.Time) {
	var first K
	var at time.Time
	for k, e := range c.entries {
		if !now.Before(e.expires) {
			delete(c.entries, k)
			continue
		}
		if at.IsZero() || e.expires.Before(at) {
			first, at = k, e.expires
		}
	}
	if len(c.entries) >= c.cfg.Size {
		delete(c.entries, first)
	}
}

func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}
