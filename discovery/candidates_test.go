package discovery

import (
	"errors"
	"testing"
	"time"
)

// A join is followed by one more state exchange with the same address
// after the settle time, even though the address is a member by then;
// after that the address is only rechecked, and a failure backs off.
func TestJoinIsFollowedUpOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCandidates(time.Second, 15*time.Second)
	c.now = func() time.Time { return now }
	const seed = "192.0.2.1:7946"
	c.add(seed, SourceSeed, 0)

	steps := []struct {
		name       string
		after      time.Duration
		do         func()
		wantDue    bool
		wantResync bool
	}{
		{"new candidate is due at once", 0, func() {}, true, false},
		{"joined: not due before the settle time", 0, func() { c.joined(seed, now) }, false, true},
		{"due for the follow-up after the settle time", c.settle, func() {}, true, true},
		{"follow-up done: rechecked later, not followed up again", 0, func() { c.result(seed, nil) }, false, false},
		{"due for the recheck", c.recheck, func() {}, true, false},
		{"a failed join backs off without a follow-up", 0, func() { c.result(seed, errors.New("refused")) }, false, false},
	}
	for _, s := range steps {
		now = now.Add(s.after)
		s.do()
		due := c.due()
		if gotDue := len(due) == 1; gotDue != s.wantDue {
			t.Fatalf("%s: due = %v, want %v", s.name, gotDue, s.wantDue)
		}
		c.mu.Lock()
		resync := c.table[seed].resync
		c.mu.Unlock()
		if resync != s.wantResync {
			t.Fatalf("%s: follow-up pending = %v, want %v", s.name, resync, s.wantResync)
		}
	}
}

// The member's push makes the follow-up needless, also when it comes
// while the join is still returning, before the join is recorded; a push
// from before the join does not count.
func TestPushMakesTheFollowUpNeedless(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCandidates(time.Second, 15*time.Second)
	c.now = func() time.Time { return now }
	const seed = "192.0.2.1:7946"
	pending := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.table[seed].resync
	}
	c.add(seed, SourceSeed, 0)
	c.joined(seed, now)
	c.pushed(seed)
	if pending() {
		t.Fatal("a push after the join was recorded left the follow-up pending")
	}

	now = now.Add(time.Minute)
	began := now
	now = now.Add(10 * time.Millisecond)
	c.pushed(seed) // the push overtook the join's return
	c.joined(seed, began)
	if pending() {
		t.Fatal("a push that came while the join was returning left the follow-up pending")
	}

	now = now.Add(time.Minute)
	c.joined(seed, now) // a join after the last push
	if !pending() {
		t.Fatal("a push from before the join made its follow-up needless")
	}
}

// The join loop sleeps until the next candidate is due when that comes
// before its tick: a follow-up is tried a settle time after its join,
// not up to a tick later.
func TestUntilTheNextCandidate(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCandidates(time.Second, 15*time.Second)
	c.now = func() time.Time { return now }
	const tick = 250 * time.Millisecond
	if got := c.until(tick); got != tick {
		t.Fatalf("no candidate: until %v, want the tick %v", got, tick)
	}
	c.add("192.0.2.1:7946", SourceSeed, 0)
	if got := c.until(tick); got != 0 {
		t.Fatalf("a new candidate: until %v, want 0 (due)", got)
	}
	c.joined("192.0.2.1:7946", time.Time{})
	now = now.Add(c.settle - 100*time.Millisecond)
	if got := c.until(tick); got != 100*time.Millisecond {
		t.Fatalf("100 ms before the follow-up: until %v, want 100ms", got)
	}
	now = now.Add(time.Second)
	if got := c.until(tick); got != 0 {
		t.Fatalf("the follow-up overdue: until %v, want 0", got)
	}
	c.result("192.0.2.1:7946", nil)
	if got := c.until(tick); got != tick {
		t.Fatalf("rechecked in %v: until %v, want the tick", c.recheck, got)
	}
}
