package kubeletapi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// reviewer stands for the API server's authorizer: what it allows, and
// how many reviews it was asked.
type reviewer struct {
	allowed map[string]bool // by user
	fail    error
	asked   int
}

func (r *reviewer) ask(_ context.Context, u kubeletUser, method, node string) (bool, string, error) {
	r.asked++
	if r.fail != nil {
		return false, "", r.fail
	}
	if r.allowed[u.name] {
		return true, "", nil
	}
	return false, "no RBAC policy matched", nil
}

// The cache answers a question again while fresh, asks again after the
// TTL (shorter for a refusal), keeps errors out, tells apart users,
// groups, verbs and nodes, and holds no more than its size.
func TestKubeletAuthCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &reviewer{allowed: map[string]bool{"alice": true}}
	hits, misses := prometheus.NewCounter(prometheus.CounterOpts{Name: "h"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "m"})
	c := newAuthCache(r.ask, 10*time.Second, 5*time.Second, 8, hits, misses)
	c.now = func() time.Time { return now }
	alice, bob := kubeletUser{name: "alice", groups: []string{"b", "a"}}, kubeletUser{name: "bob"}
	check := func(step string, u kubeletUser, method, node string, wantAllowed bool, wantAsked int) {
		t.Helper()
		allowed, _, err := c.authorize(t.Context(), u, method, node)
		if err != nil || allowed != wantAllowed || r.asked != wantAsked {
			t.Fatalf("%s: allowed %v (%v), %d reviews; want %v, %d", step, allowed, err, r.asked, wantAllowed, wantAsked)
		}
	}
	check("first", alice, "GET", "n1", true, 1)
	check("again", alice, "GET", "n1", true, 1)
	check("groups in another order", kubeletUser{name: "alice", groups: []string{"a", "b"}}, "GET", "n1", true, 1)
	check("HEAD is get too", alice, "HEAD", "n1", true, 1)
	check("other groups", kubeletUser{name: "alice"}, "GET", "n1", true, 2)
	check("another verb", alice, "POST", "n1", true, 3)
	now = now.Add(3 * time.Second)
	check("a refusal", bob, "GET", "n1", false, 4)
	check("the refusal again", bob, "GET", "n1", false, 4)
	if h, m := testutil.ToFloat64(hits), testutil.ToFloat64(misses); h != 4 || m != 4 {
		t.Errorf("%v hits, %v misses; want 4 and 4", h, m)
	}

	// Revoked: still allowed until the TTL, refused after it.
	r.allowed["alice"] = false
	now = now.Add(6 * time.Second) // 9 s after the first answer
	check("revoked, within the TTL", alice, "GET", "n1", true, 4)
	now = now.Add(time.Second)
	check("revoked, past the TTL", alice, "GET", "n1", false, 5)
	// Granted: the refusal is kept only its shorter TTL.
	r.allowed["bob"] = true
	now = now.Add(5 * time.Second)
	check("bob granted, past the refusal's TTL", bob, "GET", "n1", true, 6)

	// Errors are not cached.
	r.fail = errors.New("connection refused")
	if _, _, err := c.authorize(t.Context(), alice, "GET", "n2"); err == nil {
		t.Fatal("an error of the review was not returned")
	}
	r.fail = nil
	check("after an error", alice, "GET", "n2", false, 8)

	// Bounded: never more than its size, the entry expiring first gone.
	c.size = 3
	for i := range 10 {
		check(fmt.Sprintf("node %d", i), bob, "GET", fmt.Sprintf("x%d", i), true, 9+i)
		if len(c.entries) > 3 {
			t.Fatalf("%d entries, size 3", len(c.entries))
		}
	}
	check("the newest still cached", bob, "GET", "x9", true, 18)
}
