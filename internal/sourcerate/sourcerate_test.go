package sourcerate

import (
	"net/netip"
	"testing"
	"time"
)

// One source passes up to its burst, then at its rate; another source
// has a bucket of its own; an IPv4-mapped address is its IPv4 one.
func TestLimiterPerSource(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := New(10, 5, 16)
	l.Now = func() time.Time { return now }
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for _, step := range []struct {
		what  string
		from  netip.Addr
		after time.Duration
		sent  int
		want  int
	}{
		{"a burst", a, 0, 20, 5},
		{"another source, at once", b, 0, 5, 5},
		{"the first again at once, IPv4-mapped", netip.MustParseAddr("::ffff:192.0.2.1"), 0, 3, 0},
		{"a tenth of a second later: one more", a, 100 * time.Millisecond, 3, 1},
		{"a second later: a full burst, no more", a, time.Second, 20, 5},
	} {
		now = now.Add(step.after)
		got := 0
		for range step.sent {
			if l.Allow(step.from) {
				got++
			}
		}
		if got != step.want {
			t.Errorf("%s: %d of %d passed, want %d", step.what, got, step.sent, step.want)
		}
	}
}

// Past its bound the table forgets the idle sources: one that keeps
// sending stays limited (its bucket is not handed a new burst), and the
// table never holds more than its bound, however many sources come.
func TestLimiterTableIsBounded(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := New(1, 2, 4)
	l.Now = func() time.Time { return now }
	busy := netip.MustParseAddr("192.0.2.1")
	l.Allow(busy)
	l.Allow(busy) // its bucket is empty
	for i := range 3 {
		l.Allow(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	now = now.Add(time.Second) // the others' buckets are full again, busy's holds one
	l.Allow(netip.MustParseAddr("10.0.0.9"))
	if n := l.Len(); n != 2 {
		t.Errorf("%d sources kept after the idle ones were forgotten, want 2 (busy and the new one)", n)
	}
	if !l.Allow(busy) || l.Allow(busy) {
		t.Errorf("the busy source did not keep its bucket of one token")
	}
	for i := range 10000 {
		l.Allow(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
		if n := l.Len(); n > 4 {
			t.Fatalf("%d sources kept, bound 4", n)
		}
	}
}
