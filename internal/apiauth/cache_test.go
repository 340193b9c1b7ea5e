package apiauth_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/internal/apiauth"
)

// reviewer stands for the API server: what it allows, by question, and
// how many reviews it was asked.
type reviewer struct {
	allowed map[string]bool
	fail    error
	asked   int
}

func (r *reviewer) ask(q string) func(context.Context) (string, bool, error) {
	return func(context.Context) (string, bool, error) {
		r.asked++
		if r.fail != nil {
			return "", false, r.fail
		}
		if r.allowed[q] {
			return "yes", true, nil
		}
		return "no RBAC policy matched", false, nil
	}
}

// The cache answers a question again while fresh, asks again after the
// TTL (shorter for a refusal) or once forgotten, keeps errors out, counts
// hits and misses, and holds no more than its size.
func TestCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &reviewer{allowed: map[string]bool{"alice": true}}
	hits, misses := prometheus.NewCounter(prometheus.CounterOpts{Name: "h"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "m"})
	c := apiauth.NewCache[string, string](apiauth.CacheConfig{TTL: 10 * time.Second, RefusedTTL: 5 * time.Second, Size: 8,
		Now: func() time.Time { return now }, Hits: hits, Misses: misses})
	check := func(step, q, want string, wantAsked int) {
		t.Helper()
		got, err := c.Get(t.Context(), q, r.ask(q))
		if err != nil || got != want || r.asked != wantAsked {
			t.Fatalf("%s: %q (%v), %d reviews; want %q, %d", step, got, err, r.asked, want, wantAsked)
		}
	}
	check("first", "alice", "yes", 1)
	check("again", "alice", "yes", 1)
	check("another question", "alice-post", "no RBAC policy matched", 2)
	now = now.Add(3 * time.Second)
	check("a refusal", "bob", "no RBAC policy matched", 3)
	check("the refusal again", "bob", "no RBAC policy matched", 3)
	if h, m := testutil.ToFloat64(hits), testutil.ToFloat64(misses); h != 2 || m != 3 {
		t.Errorf("%v hits, %v misses; want 2 and 3", h, m)
	}

	// Revoked: still allowed until the TTL, refused after it.
	r.allowed["alice"] = false
	now = now.Add(6 * time.Second) // 9 s after the first answer
	check("revoked, within the TTL", "alice", "yes", 3)
	now = now.Add(time.Second)
	check("revoked, past the TTL", "alice", "no RBAC policy matched", 4)
	// Granted: the refusal is kept only its shorter TTL.
	r.allowed["bob"] = true
	now = now.Add(5 * time.Second)
	check("bob granted, past the refusal's TTL", "bob", "yes", 5)

	// Forgotten (its owner saw the answer change): asked at once.
	r.allowed["bob"] = false
	check("bob revoked, within the TTL", "bob", "yes", 5)
	c.Forget("bob")
	check("bob forgotten", "bob", "no RBAC policy matched", 6)

	// Errors are not kept.
	r.fail = errors.New("connection refused")
	if _, err := c.Get(t.Context(), "carol", r.ask("carol")); err == nil {
		t.Fatal("an error of the review was not returned")
	}
	r.fail = nil
	check("after an error", "carol", "no RBAC policy matched", 8)

	// Bounded: never more than its size, the entry expiring first gone.
	c = apiauth.NewCache[string, string](apiauth.CacheConfig{TTL: 10 * time.Second, RefusedTTL: 5 * time.Second, Size: 3,
		Now: func() time.Time { return now }})
	for i := range 10 {
		q := fmt.Sprintf("node %d", i)
		r.allowed[q] = true
		check(q, q, "yes", 9+i)
		if n := c.Len(); n > 3 {
			t.Fatalf("%d answers kept, size 3", n)
		}
	}
	check("the newest still kept", "node 9", "yes", 18)
}
