// Package eventually waits, in tests, for a state the system under test
// reaches by itself: a tunnel configured, an object written, a goroutine
// gone. It is the one such helper of the tree's tests.
package eventually

import (
	"testing"
	"time"
)

// Poll is how often the condition is tried again.
const Poll = 10 * time.Millisecond

// Within calls cond until it returns nil and returns how long that took.
// After d it fails t with what and cond's last error, which should say
// what was seen instead.
func Within(t testing.TB, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(Poll)
	}
}
