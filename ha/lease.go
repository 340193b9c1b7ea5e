package ha

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

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
	Kube      kubeclient.Interface
	Namespace string
	// Identity names this replica in the Lease; NewIdentity makes one.
	Identity string
	Log      *slog.Logger
	// Timings; zero means the defaults above. LeaseDuration is whole
	// seconds (the Lease holds seconds).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	mu        sync.Mutex
	active    bool
	since     time.Time // when this replica last became active or standby
	failovers int
	metrics   []prometheus.Collector
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

func (e *Elector) timings() (lease, renew, retry time.Duration) {
	lease, renew, retry = e.LeaseDuration, e.RenewDeadline, e.RetryPeriod
	if lease <= 0 {
		lease = DefaultLeaseDuration
	}
	if renew <= 0 {
		renew = DefaultRenewDeadline
	}
	if retry <= 0 {
		retry = DefaultRetryPeriod
	}
	return lease, renew, retry
}

// Run campaigns for the Lease until ctx ends or this replica, having been
// active, is fenced. When it gains the Lease, active runs with a context
// that ends when the Lease is lost. When it loses the Lease (it could not
// renew in time) nothing is torn down at once: fenced runs once another
// replica holds the Lease, or the Lease has expired unrenewed, whichever
// this replica learns first; then Run returns. On ctx's end the Lease is
// released, so the standby takes over without waiting for it to expire,
// and fenced runs too.
func (e *Elector) Run(ctx context.Context, active func(ctx context.Context), fenced func()) error {
	leaseDuration, renew, retry := e.timings()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: LeaseName},
		Client:     e.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	var (
		led     bool
		lostAt  time.Time
		started = make(chan struct{})
		le      *leaderelection.LeaderElector
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: LeaseName,
		LeaseDuration: leaseDuration, RenewDeadline: renew, RetryPeriod: retry,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				close(started)
				e.become(true)
				e.Log.Info("this replica is now the active one", "lease", e.Namespace+"/"+LeaseName, "identity", e.Identity)
				active(ctx)
			},
			OnStoppedLeading: func() {
				select {
				case <-started:
					led = true
				default: // lost before OnStartedLeading's goroutine ran
					led = le.GetLeader() == e.Identity
				}
				lostAt = time.Now()
			},
			OnNewLeader: func(identity string) {
				if identity != e.Identity {
					e.Log.Info("active replica", "identity", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	e.become(false)
	le.Run(ctx)
	if !led {
		return nil
	}
	if ctx.Err() == nil {
		e.Log.Warn("lost the lease; the data path stays up until another replica holds it or the lease expires", "lease", e.Namespace+"/"+LeaseName)
		e.awaitTakeover(lostAt.Add(leaseDuration-renew), retry)
	}
	e.become(false)
	fenced()
	return nil
}

// awaitTakeover returns once the Lease names another holder, or at
// expiry: by then this replica's last renewal is older than the lease
// duration, and any other replica may hold it.
func (e *Elector) awaitTakeover(expiry time.Time, retry time.Duration) {
	for time.Now().Before(expiry) {
		ctx, cancel := context.WithTimeout(context.Background(), retry)
		l, err := e.Kube.CoordinationV1().Leases(e.Namespace).Get(ctx, LeaseName, metav1.GetOptions{})
		cancel()
		switch {
		case err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != e.Identity):
			return
		case apierrors.IsNotFound(err):
			return
		}
		time.Sleep(min(retry, time.Until(expiry)))
	}
}

func (e *Elector) become(active bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if active && !e.active {
		e.failovers++
	}
	e.active, e.since = active, time.Now()
}

// Active reports whether this replica holds the Lease, and since when it
// has been in its current role.
func (e *Elector) Active() (active bool, since time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.active, e.since
}

// Collectors are the Elector's metrics: its role, how long it has held
// it, and how many times it became the active one.
func (e *Elector) Collectors() []prometheus.Collector {
	role := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_active",
		Help: "1 while this replica of the agent holds the Lease and runs the data path, 0 while it is the standby.",
	}, func() float64 {
		if a, _ := e.Active(); a {
			return 1
		}
		return 0
	})
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_role_seconds",
		Help: "Seconds since this replica of the agent last became active or standby.",
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
	return []prometheus.Collector{role, age, takeovers}
}
