package ha

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// watchedLock is the Lease lock client-go's leader election writes
// through, recording in a hold what each read and write told: when the
// last renewal the API server accepted was sent, who holds the Lease,
// and the last error. event is signalled after each.
//
// It refuses to release the Lease while mayRelease says no: client-go
// releases it whenever a round of renewals fails (ReleaseOnCancel), and a
// standby could then take it over at once while this replica's data path
// is still up.
type watchedLock struct {
	resourcelock.Interface
	mayRelease func() bool
	// restarting: the election is stopped only to start again at once
	// (Elector.campaign), not to give up the Lease.
	restarting atomic.Bool

	// intervals, when set, learns the seconds between consecutive
	// renewals this replica had accepted (by when each was sent).
	intervals prometheus.Observer

	mu      sync.Mutex
	hold    hold
	lastErr error
	event   chan struct{}
}

func (l *watchedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	l.mu.Lock()
	switch {
	case err != nil:
		l.lastErr = err
	default:
		l.hold.holder = r.HolderIdentity
	}
	l.mu.Unlock()
	l.signal()
	return r, raw, err
}

func (l *watchedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.wrote(r, time.Now(), l.Interface.Create(ctx, r))
}

func (l *watchedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if r.HolderIdentity != l.hold.me && (l.restarting.Load() || !l.mayRelease()) {
		return errHeldBack
	}
	return l.wrote(r, time.Now(), l.Interface.Update(ctx, r))
}

// errHeldBack is what client-go's release meets while the data path is
// up; it logs it and goes on.
var errHeldBack = errors.New("the Lease is not released while this replica's data path is up")

// wrote records a write of r sent at sent.
func (l *watchedLock) wrote(r resourcelock.LeaderElectionRecord, sent time.Time, err error) error {
	l.mu.Lock()
	switch {
	case err != nil:
		l.lastErr = err
	case r.HolderIdentity == l.hold.me:
		if l.intervals != nil && l.hold.holder == l.hold.me && !l.hold.renewed.IsZero() {
			l.intervals.Observe(sent.Sub(l.hold.renewed).Seconds())
		}
		l.hold.renewed, l.hold.holder, l.lastErr = sent, r.HolderIdentity, nil
	default: // released
		l.hold.holder = r.HolderIdentity
	}
	l.mu.Unlock()
	l.signal()
	return err
}

func (l *watchedLock) signal() {
	select {
	case l.event <- struct{}{}:
	default:
	}
}

// state is the hold and the last error of a read or write, nil once a
// renewal was accepted after it.
func (l *watchedLock) state() (hold, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold, l.lastErr
}
