package ha

import (
	"testing"
	"time"
)

// What becomes of the active replica's data path while its renewals fail:
// it stays until another replica could hold the Lease, then goes, unless
// no other replica could take it; it goes at once when another holds it.
func TestHoldDecides(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := hold{me: "gw1_a", leaseDuration: 4 * time.Second, margin: 500 * time.Millisecond, renewed: t0, holder: "gw1_a"}
	with := func(f func(*hold)) hold { c := h; f(&c); return c }
	for _, tc := range []struct {
		name   string
		h      hold
		at     time.Duration // after the last renewal
		others bool
		want   verdict
	}{
		{"just renewed", h, 0, true, keep},
		{"renewals failing, the Lease cannot be another's yet", h, 3 * time.Second, true, keep},
		{"just before the margin", h, 3499 * time.Millisecond, true, keep},
		{"within the margin before the Lease may be taken", h, 3500 * time.Millisecond, true, fence},
		{"the Lease may have been taken", h, 10 * time.Second, true, fence},
		{"alone: nobody can take the Lease", h, time.Hour, false, keep},
		{"another holds the Lease", with(func(h *hold) { h.holder = "gw2_b" }), 0, true, lost},
		{"another holds the Lease, alone as last seen", with(func(h *hold) { h.holder = "gw2_b" }), 0, false, lost},
		{"released by this replica: the renewal decides", with(func(h *hold) { h.holder = "" }), time.Second, true, keep},
		{"never renewed", with(func(h *hold) { h.renewed = time.Time{} }), 0, true, fence},
		{"never renewed, alone", with(func(h *hold) { h.renewed = time.Time{} }), 0, false, keep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.decide(t0.Add(tc.at), tc.others); got != tc.want {
				t.Errorf("%s after the last renewal, others %v: %s, want %s", tc.at, tc.others, got, tc.want)
			}
		})
	}
}

// The fence comes before the earliest instant a standby can take the
// Lease (a lease duration after the renewal was sent), by the margin.
func TestFenceComesBeforeTheLeaseCanBeTaken(t *testing.T) {
	for _, tc := range []struct{ lease, retry time.Duration }{
		{DefaultLeaseDuration, DefaultRetryPeriod},
		{10 * time.Second, 2 * time.Second},
		{time.Second, 100 * time.Millisecond},
	} {
		t0 := time.Now()
		h := hold{me: "a", leaseDuration: tc.lease, margin: fenceMargin(tc.retry), renewed: t0, holder: "a"}
		if d := t0.Add(tc.lease).Sub(h.fenceAt(t0)); d < tc.retry || d < 200*time.Millisecond {
			t.Errorf("lease %s, retry %s: fenced %s before the Lease may be taken, want a retry period and 200 ms at least", tc.lease, tc.retry, d)
		}
	}
}
