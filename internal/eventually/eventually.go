// Package eventually waits, in tests, for a state the system under test
// reaches by itself: a tunnel configured, an object written, a goroutine
// gone. It is the one such helper of the tree's tests.
package eventually

import (
	"fmt"
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
	took, err := Until(d, what, cond)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return took
}

// Until is Within for a goroutine, which may not end a test: it returns
// how long cond took to return nil, or after d an error with what and
// cond's last error.
func Until(d time.Duration, what string, cond func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > d {
			return time.Since(start), fmt.Errorf("%s: not within %s: %w", what, d, err)
		}
		time.Sleep(Poll)
	}
}
