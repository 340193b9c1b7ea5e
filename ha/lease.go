package ha

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// LeaseName is the coordination.k8s.io Lease the agent's replicas hold to
// be the active one, in the agent's namespace.
const LeaseName = "flotilla-agent"

// Lease timings: a replica that stops renewing is replaced after
// LeaseDuration; the active one gives up when it could not renew for
// RenewDeadline; every replica tries every RetryPeriod. Shorter than
// Submariner's 10 s / 5 s / 2 s: a renewal is one small write, and an
// active that misses them tears nothing down until the lease is another's
// or has expired (Elector.Run).
const (
	DefaultLeaseDuration = 4 * time.Second
	DefaultRenewDeadline = 3 * time.Second
	DefaultRetryPeriod   = 500 * time.Millisecond
)

// Elector makes one replica of the agent the active one by a Lease.
type Elector struct {
	// Kube should be a client of its own (kubeclient.NewOwnConnection):
	// renewals must not queue behind the process's other requests.
	Kube      kubeclient.Interface
	Namespace string
	// Identity names this replica in the Lease; NewIdentity makes one.
	Identity string
	Log      *slog.Logger
	// Timings; zero means the defaults above. LeaseDuration is whole
	// seconds (the Lease holds seconds).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// Others reports whether another replica could take the Lease
	// (Replicas.Others); nil: one always could.
	Others func() bool

	// Heartbeat, when set, lets a standby take over from an active
	// replica that died before the Lease expires (see Heartbeat); nil:
	// the Lease alone decides.
	Heartbeat *Heartbeat

	renewals prometheus.Histogram // once Collectors made it

	mu        sync.Mutex
	state     State
	since     time.Time // when this replica last changed state
	failovers int
	lock      *watchedLock // once campaigning
}

// NewIdentity is a replica's name in the Lease: its node and a random
// suffix, so two replicas on one node (a rollout) differ.
func NewIdentity(node string) string {
	b := make([]byte, 4)
	rand.Read(b)
	if node == "" {
		node = "agent"
	}
	return node + "_" + hex.EncodeToString(b)
}

// NodeOfIdentity is the node a replica's identity (NewIdentity) names;
// "" when identity is not one. A node's name holds no "_".
func NodeOfIdentity(identity string) string {
	if i := strings.LastIndex(identity, "_"); i > 0 {
		return identity[:i]
	}
	return ""
}

func (e *Elector) timings() (lease, renew, retry time.Duration) {
	return orDefault(e.LeaseDuration, DefaultLeaseDuration), orDefault(e.RenewDeadline, DefaultRenewDeadline), orDefault(e.RetryPeriod, DefaultRetryPeriod)
}

// orDefault is d, or def when d is not positive (a timing left zero).
func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// State is a replica's role as the Elector sees it.
type State int

const (
	// Standby: another replica holds the Lease, or none yet.
	Standby State = iota
	// Active: this replica holds the Lease and runs the data path.
	Active
	// Fenced: this replica held the Lease and could not renew it, and
	// another replica may hold it now: its data path must be gone. It
	// goes on campaigning; it is Active again if the Lease turns out to
	// be still its own.
	Fenced
)

func (s State) String() string {
	return [...]string{"standby", "active", "fenced"}[s]
}

// Run campaigns for the Lease until ctx ends or, having been active, this
// replica learns that another one holds the Lease. changed learns every
// change of role, and must have made it so before it returns: Active when
// this replica gains the Lease (and when it renews it again after it was
// fenced), Fenced when the data path must go. A missed renewal changes
// nothing until another replica could hold the Lease (hold.decide); then
// the replica is fenced, unless no other replica could take the Lease
// (Others). On ctx's end an active replica is fenced first, then releases
// the Lease, so a standby takes over without waiting for it to expire and
// never while this one's data path is up.
func (e *Elector) Run(ctx context.Context, changed func(State)) error {
	leaseDuration, renew, retry := e.timings()
	lock := &watchedLock{
		Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: LeaseName},
			Client:     e.Kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
		},
		hold:       hold{me: e.Identity, leaseDuration: leaseDuration, margin: fenceMargin(retry)},
		event:      make(chan struct{}, 1),
		mayRelease: func() bool { a, _ := e.Active(); return !a },
		intervals:  e.renewals,
	}
	if hb := e.Heartbeat; hb != nil {
		hb.me, hb.log = e.Identity, e.Log.With("component", "heartbeat")
		lock.hold.earliest = hb.earliestTake
	}
	e.mu.Lock()
	e.lock = lock
	e.mu.Unlock()
	cfg := leaderelection.LeaderElectionConfig{
		Lock: lock, Name: LeaseName,
		LeaseDuration: leaseDuration, RenewDeadline: renew, RetryPeriod: retry,
		ReleaseOnCancel: true,
	}
	e.become(Standby)
	// The campaign runs until this replica is done with the Lease, not
	// until ctx ends: it must not release the Lease before the data
	// path is gone.
	campaignCtx, stopCampaign := context.WithCancel(context.Background())
	won := make(chan struct{})
	campaigned := make(chan error, 1)
	go func() { campaigned <- e.campaign(campaignCtx, cfg, lock, won) }()
	defer func() { stopCampaign(); <-campaigned }()
	select {
	case <-won:
	case <-ctx.Done():
		return nil
	case err := <-campaigned:
		return err
	}
	e.become(Active)
	e.Log.Info("this replica is now the active one", "lease", e.Namespace+"/"+LeaseName, "identity", e.Identity)
	changed(Active)
	e.watch(ctx, lock, changed, retry)
	if a, _ := e.Active(); a {
		e.become(Fenced)
		changed(Fenced)
	}
	return nil
}

// campaign runs client-go's leader election again each time it gives up
// (a renewal failed for the renew deadline), until ctx ends: a replica
// whose Lease is still its own takes it back at once. won is closed when
// it first holds the Lease.
//
// Until then it also watches the Lease, and when it sees it released it
// starts the election again, whose first try is at once: client-go's
// election tries only every retry period, and a stopping active releases
// the Lease so that a standby takes over without waiting. When the watch
// saw no renewal for a lease duration, it takes the Lease itself and
// starts the election again, which finds the Lease its own
// (watchLease).
func (e *Elector) campaign(ctx context.Context, cfg leaderelection.LeaderElectionConfig, lock *watchedLock, won chan struct{}) error {
	var once sync.Once
	cfg.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(context.Context) { once.Do(func() { close(won) }) },
		OnStoppedLeading: func() {},
		OnNewLeader: func(identity string) {
			if identity != e.Identity {
				e.Log.Info("active replica", "identity", identity)
			}
		},
	}
	released := make(chan struct{}, 1)
	expired := make(chan expiry)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchLease(watchCtx, e.Kube, e.Namespace, e.Identity, cfg.LeaseDuration, e.Heartbeat, released, expired)
	}()
	defer func() { stopWatch(); <-watched }()
	if hb := e.Heartbeat; hb != nil {
		beating := make(chan struct{})
		go func() {
			defer close(beating)
			hb.run(ctx, func() bool { a, _ := e.Active(); return a }, expired)
		}()
		defer func() { <-beating }()
	}
	standby := won
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(cfg)
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		attempt, cancel := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() { defer close(ran); le.Run(attempt) }()
	running:
		for {
			select {
			case <-ran:
				break running
			case <-standby:
				standby, released, expired = nil, nil, nil
				stopWatch()
			case <-released:
				e.Log.Info("the Lease was released: trying to take it now", "lease", e.Namespace+"/"+LeaseName)
				e.restart(lock, cancel, ran)
				select { // seen by the next election's first try
				case <-released:
				default:
				}
				break running
			case x := <-expired:
				l := x.lease
				if err := e.takeExpired(ctx, l, cfg.LeaseDuration, cfg.RenewDeadline); err != nil {
					// Renewed meanwhile (a conflict), or taken by
					// another: the watch or the next try sees it.
					e.Log.Debug("expired Lease not taken", "lease", e.Namespace+"/"+LeaseName, "err", err)
					continue
				}
				e.Log.Info(x.why, "lease", e.Namespace+"/"+LeaseName, "holder", ptr.Deref(l.Spec.HolderIdentity, ""))
				e.restart(lock, cancel, ran) // the next election finds the Lease its own
				break running
			}
		}
		cancel()
	}
	return nil
}

// takeExpired makes this replica the holder of l, the Lease as last seen
// held by another and not renewed for a lease duration since, as
// client-go's election takes an expired Lease, within timeout; the update
// is conditional on l's resourceVersion, so it fails if the Lease changed
// since.
func (e *Elector) takeExpired(ctx context.Context, l *coordinationv1.Lease, leaseDuration, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l = l.DeepCopy()
	now := metav1.NewMicroTime(time.Now())
	seconds := int32(leaseDuration / time.Second)
	transitions := ptr.Deref(l.Spec.LeaseTransitions, 0) + 1
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &e.Identity, &seconds
	l.Spec.AcquireTime, l.Spec.RenewTime, l.Spec.LeaseTransitions = &now, &now, &transitions
	_, err := e.Kube.CoordinationV1().Leases(e.Namespace).Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// restart stops an election that may have just taken the Lease without
// releasing it: the next election finds the Lease its own and keeps it.
func (e *Elector) restart(lock *watchedLock, cancel context.CancelFunc, ran <-chan struct{}) {
	lock.restarting.Store(true)
	defer lock.restarting.Store(false)
	cancel()
	<-ran
}

// watch follows the active replica's hold on the Lease until ctx ends or
// another replica holds it, fencing and unfencing it as hold.decide says.
func (e *Elector) watch(ctx context.Context, lock *watchedLock, changed func(State), retry time.Duration) {
	var (
		failing string // the renewal error last logged
		alone   bool   // kept past the fence for want of another replica, logged
		// fencedAt is when this replica was last fenced.
		fencedAt time.Time
	)
	for {
		h, lastErr := lock.state()
		others := e.Others == nil || e.Others()
		now := time.Now()
		v := h.decide(now, others)
		active, _ := e.Active()
		switch {
		case v == lost:
			e.Log.Info("another replica holds the Lease; this one is the standby now", "lease", e.Namespace+"/"+LeaseName, "holder", h.holder)
			return
		case v == fence && active:
			e.Log.Warn("the Lease was not renewed for a lease duration and another replica may hold it: removing the data path",
				"lease", e.Namespace+"/"+LeaseName, "lastRenewal", h.renewed.Format(time.RFC3339Nano))
			fencedAt = now
			e.become(Fenced)
			changed(Fenced)
		case v == keep && !active && h.renewed.After(fencedAt):
			e.Log.Info("the Lease is this replica's again: bringing the data path back", "lease", e.Namespace+"/"+LeaseName)
			e.become(Active)
			changed(Active)
		}
		switch {
		case lastErr != nil && lastErr.Error() != failing:
			failing = lastErr.Error()
			e.Log.Warn("the Lease was not renewed; the data path stays up while no other replica can hold it",
				"lease", e.Namespace+"/"+LeaseName, "err", lastErr, "until", h.fenceAt(now).Format(time.RFC3339Nano))
		case lastErr == nil && failing != "":
			failing = ""
			e.Log.Info("the Lease is renewed again", "lease", e.Namespace+"/"+LeaseName)
		}
		switch past := !now.Before(h.fenceAt(now)); {
		case past && !others && !alone && lastErr != nil:
			alone = true
			e.Log.Warn("the Lease was not renewed for a lease duration, and no other replica could take it: the data path stays up", "lease", e.Namespace+"/"+LeaseName)
		case !past:
			alone = false
		}
		wait := retry
		if at := time.Until(h.fenceAt(now)); at > 0 && at < wait {
			wait = at
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-lock.event:
		case <-t.C:
		}
		t.Stop()
	}
}

func (e *Elector) become(s State) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s == Active && e.state == Standby {
		e.failovers++
	}
	if s != e.state || e.since.IsZero() {
		e.since = time.Now()
	}
	e.state = s
}

// Active reports whether this replica holds the Lease and runs the data
// path, and since when it has been in its current state.
func (e *Elector) Active() (active bool, since time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state == Active, e.since
}

// Collectors are the Elector's metrics: its role, how long it has held
// it, how many times it became the active one, and the intervals between
// its renewals; with a Heartbeat, how long since it heard another
// replica. Set Heartbeat first, and call it before Run.
func (e *Elector) Collectors() []prometheus.Collector {
	role := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_active",
		Help: "1 while this replica of the agent holds the Lease and runs the data path, 0 while it is the standby or fenced.",
	}, func() float64 {
		if a, _ := e.Active(); a {
			return 1
		}
		return 0
	})
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_role_seconds",
		Help: "Seconds since this replica of the agent last became active, standby or fenced.",
	}, func() float64 {
		_, since := e.Active()
		return time.Since(since).Seconds()
	})
	takeovers := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "flotilla_gateway_takeovers_total",
		Help: "Times this replica of the agent became the active one.",
	}, func() float64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		return float64(e.failovers)
	})
	leaseAge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_lease_age_seconds",
		Help: "Seconds since this replica of the agent sent the last renewal of the Lease the API server accepted; 0 before it first held the Lease. Past the lease duration, another replica may hold it.",
	}, func() float64 {
		e.mu.Lock()
		lock := e.lock
		e.mu.Unlock()
		if lock == nil {
			return 0
		}
		h, _ := lock.state()
		if h.renewed.IsZero() {
			return 0
		}
		return time.Since(h.renewed).Seconds()
	})
	e.renewals = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "flotilla_gateway_lease_renewal_interval_seconds",
		Help:    "Seconds between consecutive renewals of the Lease this replica of the agent had accepted, by when each was sent: a retry period when all is well; near the lease duration, the replica is about to fence itself (a busy node or API server).",
		Buckets: []float64{0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 10},
	})
	cs := []prometheus.Collector{role, age, takeovers, leaseAge, e.renewals}
	if e.Heartbeat != nil {
		cs = append(cs, e.Heartbeat.collector())
	}
	return cs
}
