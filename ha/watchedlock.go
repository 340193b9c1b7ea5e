package ha

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// watchedLock is the Lease lock client-go's leader election writes
// through, recording in a hold what each read and write told: when the
// last renewal the API server accepted was sent, who holds the Lease,
// and the last error. event is signalled after each.
type watchedLock struct {
	resourcelock.Interface

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
	return l.wrote(r, time.Now(), l.Interface.Update(ctx, r))
}

// wrote records a write of r sent at sent.
func (l *watchedLock) wrote(r resourcelock.LeaderElectionRecord, sent time.Time, err error) error {
	l.mu.Lock()
	switch {
	case err != nil:
		l.lastErr = err
	case r.HolderIdentity == l.hold.me:
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
