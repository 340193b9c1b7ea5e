package kubeletapi

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The kubelet API's SubjectAccessReviews are cached, as a kubelet caches
// its webhook authorizer's answers: `kubectl logs -f` on the pods of a
// Deployment, or a port-forward's connections, would otherwise cost a
// review each. The TTLs are short, so that a permission revoked stops
// working soon; a refusal is kept shorter still, so that one just granted
// works soon.
const (
	DefaultAuthorizedTTL   = 10 * time.Second
	DefaultUnauthorizedTTL = 5 * time.Second
	// kubeletAuthCacheSize bounds the entries: a caller, a verb and a
	// node each. Few callers use a kubelet API (the API server's kubelet
	// client, mostly), so this is room to spare, and a bound against one
	// that cycles names.
	kubeletAuthCacheSize = 1024
)

// authorizeFunc asks whether u may use the kubelet API of node with the
// verb of method (authorizeProxy), uncached.
type authorizeFunc func(ctx context.Context, u kubeletUser, method, node string) (allowed bool, reason string, err error)

// authCache answers from what an authorizeFunc said, for a while.
type authCache struct {
	ask                       authorizeFunc
	authorizedTTL, refusedTTL time.Duration
	size                      int
	now                       func() time.Time
	hits, misses              prometheus.Counter

	mu      sync.Mutex
	entries map[authKey]authEntry
}

// authKey is what a review asks: the same question, the same answer.
type authKey struct {
	user, groups, verb, node string
}

type authEntry struct {
	allowed bool
	reason  string
	expires time.Time
}

func newAuthCache(ask authorizeFunc, authorizedTTL, refusedTTL time.Duration, size int, hits, misses prometheus.Counter) *authCache {
	return &authCache{
		ask: ask, authorizedTTL: authorizedTTL, refusedTTL: refusedTTL, size: size, now: time.Now,
		hits: hits, misses: misses, entries: map[authKey]authEntry{},
	}
}

// authorize answers from the cache while the answer is fresh, else asks.
// Errors are not cached: the next request asks again.
func (c *authCache) authorize(ctx context.Context, u kubeletUser, method, node string) (bool, string, error) {
	groups := slices.Clone(u.groups)
	slices.Sort(groups)
	// NUL cannot be in a user's or a group's name from a certificate.
	key := authKey{user: u.name, groups: strings.Join(groups, "\x00"), verb: verbOf(method), node: node}
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && c.now().Before(e.expires) {
		c.mu.Unlock()
		c.hits.Inc()
		return e.allowed, e.reason, nil
	}
	c.mu.Unlock()
	c.misses.Inc()
	allowed, reason, err := c.ask(ctx, u, method, node)
	if err != nil {
		return false, "", err
	}
	ttl := c.refusedTTL
	if allowed {
		ttl = c.authorizedTTL
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.size {
		c.evict(now)
	}
	c.entries[key] = authEntry{allowed: allowed, reason: reason, expires: now.Add(ttl)}
	return allowed, reason, nil
}

// evict makes room for one entry: the expired ones go, else the one that
// expires first.
func (c *authCache) evict(now time.Time) {
	var first authKey
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
	if len(c.entries) >= c.size {
		delete(c.entries, first)
	}
}
