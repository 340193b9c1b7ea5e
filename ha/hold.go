package ha

import "time"

// hold is what the active replica knows of its hold on the Lease, and
// decides what becomes of its data path while its renewals fail.
//
// A standby takes the Lease once it has seen no renewal for a lease
// duration by its own clock, counted from when it read the last one, which
// is no earlier than when this replica sent it. So until a lease duration
// after this replica sent its last accepted renewal, no other replica can
// hold the Lease: the data path stays. The margin before that instant is
// for removing the data path (tens of milliseconds) and for being late.
// After it, the data path goes if another replica could take the Lease,
// and stays if none could (one replica: nobody can take it over, and an
// API server that does not answer must not stop the traffic).
type hold struct {
	me                    string
	leaseDuration, margin time.Duration
	// renewed is when the last write of the Lease naming this replica
	// that the API server accepted was sent; zero: none yet.
	renewed time.Time
	// holder is the holder the Lease named when last read or written:
	// "" when released or not read yet.
	holder string
	// earliest, when set, is the earliest instant a standby could take
	// the Lease before it expires, as known at now, for a last renewal
	// sent at renewed (Heartbeat.earliestTake); zero: none could.
	earliest func(renewed, now time.Time) time.Time
}

// verdict is what becomes of the data path.
type verdict int

const (
	// keep: the Lease is this replica's, or can be no other's yet, or
	// no other replica could take it.
	keep verdict = iota
	// fence: another replica may hold the Lease now; the data path goes.
	fence
	// lost: another replica holds the Lease.
	lost
)

func (v verdict) String() string {
	return [...]string{"keep", "fence", "lost"}[v]
}

// decide says what becomes of the data path at now; others tells whether
// another replica could take the Lease.
func (h hold) decide(now time.Time, others bool) verdict {
	switch {
	case h.holder != "" && h.holder != h.me:
		return lost
	case h.renewed.IsZero():
		if others {
			return fence
		}
		return keep
	case now.Before(h.fenceAt(now)) || !others:
		return keep
	}
	return fence
}

// fenceAt is the instant after which the data path goes, when another
// replica could take the Lease, as known at now.
func (h hold) fenceAt(now time.Time) time.Time {
	at := h.renewed.Add(h.leaseDuration)
	if h.earliest != nil {
		if early := h.earliest(h.renewed, now); !early.IsZero() && early.Before(at) {
			at = early
		}
	}
	return at.Add(-h.margin)
}

// fenceMargin is the margin for the given retry period: a retry period,
// the time an active replica would be late by if it only looked at each
// retry, and no less than 200 ms.
func fenceMargin(retry time.Duration) time.Duration {
	return max(retry, 200*time.Millisecond)
}
