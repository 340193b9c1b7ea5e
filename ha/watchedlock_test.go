package ha

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// fakeLock answers as told and records what it was asked to write and
// when.
type fakeLock struct {
	resourcelock.Interface
	err     error
	holder  string
	written []resourcelock.LeaderElectionRecord
	at      time.Time // when the last write reached it
}

func (f *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	if f.err != nil {
		return nil, nil, f.err
	}
	return &resourcelock.LeaderElectionRecord{HolderIdentity: f.holder}, nil, nil
}

func (f *fakeLock) Update(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	f.at = time.Now()
	time.Sleep(time.Millisecond) // the answer comes after the write was sent
	if f.err != nil {
		return f.err
	}
	f.written = append(f.written, r)
	return nil
}

// The lock records when the last accepted renewal was sent (not when it
// was answered), who the Lease names and the last error; and it holds a
// release back while the data path is up.
func TestWatchedLock(t *testing.T) {
	active := true
	inner := &fakeLock{}
	l := &watchedLock{Interface: inner, hold: hold{me: "gw1_a"}, event: make(chan struct{}, 1), mayRelease: func() bool { return !active }}
	ctx := context.Background()
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "gw1_a"}

	sent := time.Now()
	if err := l.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	h, err := l.state()
	if err != nil || h.holder != "gw1_a" || h.renewed.Before(sent) || h.renewed.After(inner.at) {
		t.Fatalf("after a renewal: %+v, %v; want renewed when sent (%s, before it reached the API server at %s)", h, err, sent, inner.at)
	}

	inner.err = errors.New("timeout")
	if err := l.Update(ctx, mine); err == nil {
		t.Fatal("a failed renewal succeeded")
	}
	if h2, err := l.state(); err == nil || !h2.renewed.Equal(h.renewed) {
		t.Fatalf("after a failed renewal: %+v, %v; want the last renewal kept and the error", h2, err)
	}

	inner.err = nil
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); !errors.Is(err, errHeldBack) || len(inner.written) != 1 {
		t.Fatalf("release while active: %v, %d writes; want held back, nothing written", err, len(inner.written))
	}
	active = false
	l.restarting.Store(true)
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); !errors.Is(err, errHeldBack) || len(inner.written) != 1 {
		t.Fatalf("release while the election restarts: %v, %d writes; want held back, nothing written", err, len(inner.written))
	}
	l.restarting.Store(false)
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil || len(inner.written) != 2 {
		t.Fatalf("release once fenced: %v, %d writes; want written", err, len(inner.written))
	}

	inner.holder = "gw2_b"
	if _, _, err := l.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if h, _ := l.state(); h.decide(time.Now(), true) != lost {
		t.Fatalf("after reading the Lease held by another: %+v decides %s, want lost", h, h.decide(time.Now(), true))
	}
	select {
	case <-l.event:
	default:
		t.Fatal("no event after reads and writes")
	}
}

// The lock learns the interval between consecutive renewals of this
// replica's, by when each was sent: not the first taking of the Lease,
// nor one after another replica held it; a failed renewal in between
// lengthens the interval.
func TestWatchedLockRenewalIntervals(t *testing.T) {
	intervals := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "intervals", Buckets: []float64{0.01, 1}})
	inner := &fakeLock{holder: "gw2_b"}
	l := &watchedLock{Interface: inner, hold: hold{me: "gw1_a"}, event: make(chan struct{}, 1), mayRelease: func() bool { return false }, intervals: intervals}
	ctx := context.Background()
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "gw1_a"}
	count := func() (uint64, float64) {
		var m dto.Metric
		if err := intervals.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	renew := func() time.Time {
		t.Helper()
		sent := time.Now()
		if err := l.Update(ctx, mine); err != nil {
			t.Fatal(err)
		}
		return sent
	}

	if _, _, err := l.Get(ctx); err != nil { // held by gw2_b
		t.Fatal(err)
	}
	first := renew() // taken over from gw2_b
	if n, _ := count(); n != 0 {
		t.Fatalf("taking the Lease over counted %d intervals, want none", n)
	}
	time.Sleep(20 * time.Millisecond)
	inner.err = errors.New("timeout")
	if err := l.Update(ctx, mine); err == nil {
		t.Fatal("a failed renewal succeeded")
	}
	inner.err = nil
	second := renew()
	if n, sum := count(); n != 1 || sum < second.Sub(first).Seconds()-0.005 {
		t.Fatalf("after a renewal, a failure and a renewal 20 ms apart: %d intervals summing %.3f s; want one of about %s", n, sum, second.Sub(first))
	}

	if _, _, err := l.Get(ctx); err != nil { // gw2_b took it meanwhile
		t.Fatal(err)
	}
	renew()
	if n, _ := count(); n != 1 {
		t.Fatalf("taking the Lease back from another counted an interval: %d, want 1", n)
	}
	renew()
	if n, _ := count(); n != 2 {
		t.Fatalf("a renewal after that: %d intervals, want 2", n)
	}
}
