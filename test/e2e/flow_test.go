package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// webOfB is the pod a flow of flowTo must be answered by; ok is the
// probe's line for a try started at start that webOfB answered at at,
// having seen the caller as 100.96.0.2.
var webOfB = corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-w1", UID: "uid-of-b"}}

func flowTo() *flow { return &flow{to: "b", answerer: webOfB} }

func ok(at, start time.Time) string {
	return fmt.Sprintf("ok %d %d 100.96.0.2 web-w1 uid-of-b", at.UnixNano(), start.UnixNano())
}

// A run of failed tries is lost when the path dropped their packets (the
// next try is answered at once) and held when it queued them (the next
// try's answer comes after the last failed try's deadline); lost tries
// are a cut in a run of cutRun or more, and scattered in shorter ones.
func TestFlowSortsLosses(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 7, 17, 13, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// A try every 20 ms from 0 to 3000 ms; those started in [1000, end)
	// fail; the first try after them (end) is answered after answered ms.
	flowWith := func(end, answered int) *flow {
		f := flowTo()
		for ms := 0; ms < 3000; ms += 20 {
			switch {
			case ms >= 1000 && ms < end:
				f.note(fmt.Sprintf("fail %d dial tcp: i/o timeout", at(ms).UnixNano()))
			case ms == end:
				f.note(ok(at(ms+answered), at(ms)))
			default:
				f.note(ok(at(ms+2), at(ms)))
			}
		}
		return f
	}
	for _, tc := range []struct {
		name                 string
		end, answered        int
		cut, scattered, held int
	}{
		{"cut: ten in a row, the next answered in 3 ms", 1200, 3, 10, 0, 0},
		{"cut: ten in a row, the next answered in 500 ms", 1200, 500, 10, 0, 0},
		// The last failed try started at 1180: deadline 2180; the next
		// try (1200) answered at 2150 is within the probe's slack.
		{"held: the next answered after the deadline", 1200, 1000, 0, 0, 1},
		{"held: the next answered at the deadline less the slack", 1200, 950, 0, 0, 1},
		{"scattered: one lost, the next answered in 3 ms", 1020, 3, 0, 1, 0},
		{"scattered: four in a row, the next answered in 3 ms", 1080, 3, 0, 4, 0},
		{"cut: five in a row, the next answered in 3 ms", 1100, 3, 5, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := flowWith(tc.end, tc.answered).lossesBetween(at(-10), at(3000))
			if len(l.cut) != tc.cut || len(l.scattered) != tc.scattered || len(l.held) != tc.held {
				t.Errorf("cut %d, scattered %d, held %v; want %d, %d, %d", len(l.cut), len(l.scattered), l.held, tc.cut, tc.scattered, tc.held)
			}
			if l.tries != 150 {
				t.Errorf("%d tries in the window, want 150", l.tries)
			}
		})
	}
	t.Run("a failure with no answered try after it is a cut", func(t *testing.T) {
		f := flowTo()
		f.note(ok(at(2), at(0)))
		f.note(fmt.Sprintf("fail %d dial tcp: i/o timeout", at(20).UnixNano()))
		if l := f.lossesBetween(at(0), at(100)); len(l.cut) != 1 || len(l.scattered) != 0 {
			t.Errorf("cut %v, scattered %v; want the one failure a cut", l.cut, l.scattered)
		}
	})
	t.Run("an answer from another pod of that name is not an answer", func(t *testing.T) {
		f := flowTo()
		f.note(ok(at(2), at(0)))
		f.note(fmt.Sprintf("ok %d %d 100.96.0.2 web-w1 uid-of-a", at(22).UnixNano(), at(20).UnixNano()))
		f.note(fmt.Sprintf("ok %d %d 100.96.0.2 web-w1", at(42).UnixNano(), at(40).UnixNano()))
		if len(f.oks) != 1 || f.strangers != 2 {
			t.Errorf("%d answers, %d from another pod (%s); want 1 and 2", len(f.oks), f.strangers, f.stranger)
		}
	})
	t.Run("noLoss fails on a cut and on more than one in twenty lost scattered", func(t *testing.T) {
		many := flowTo()
		for ms := 0; ms < 3000; ms += 20 {
			if ms%360 == 0 || ms%360 == 20 { // 18 of 150 lost, two in a row
				many.note(fmt.Sprintf("fail %d dial tcp: i/o timeout", at(ms).UnixNano()))
				continue
			}
			many.note(ok(at(ms+2), at(ms)))
		}
		for _, c := range []struct {
			name string
			f    *flow
			want bool
		}{{"cut", flowWith(1200, 3), false}, {"eighteen scattered in 150", many, false}, {"four in a row in 150", flowWith(1080, 3), true}} {
			rec := &recorder{TB: t}
			if got, _ := c.f.noLoss(rec, at(-10), at(3000), "in the test"); got != c.want || rec.failed == c.want {
				t.Errorf("%s: noLoss %v (failed %v), want %v", c.name, got, rec.failed, c.want)
			}
		}
	})
}

// recorder is a testing.TB that records a failure instead of failing.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Logf(string, ...any)   {}
func (r *recorder) Helper()               {}
