package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// ConsumerConfig is what a Consumer needs.
type ConsumerConfig struct {
	// Config reaches the local API server (NamespaceOffloads, Peers).
	Config      *rest.Config
	Credentials remote.Credentials
	// Sessions, when set, are the sessions with the providers shared
	// with the agent's other components; sessions of its own over
	// Credentials when nil.
	Sessions *remote.Sessions
	// Self is this cluster's ID: remote names and tenant namespaces
	// derive from it.
	Self string
	// Peers, when set, is where Peers are read and watched, shared with
	// the agent's other components (PeerCache); a cache of its own when
	// nil.
	Peers offload.PeerCache

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Consumer extends local namespaces to providers: for each
// NamespaceOffload it writes a NamespaceRequest in this cluster's tenant
// namespace on every provider its selector picks, deletes those no longer
// wanted, and sums up the providers' answers in the NamespaceOffload's
// status. It never creates a namespace on a provider: the provider's
// agent does, or refuses. Level-triggered: one reconcile per local
// namespace, from the local objects, the Peers and each provider's
// requests as its watch holds them.
type Consumer struct {
	cfg   ConsumerConfig
	log   *slog.Logger
	local cache.Cache
	write client.Client
	ctrl  *ctrl.Controller[string]
	queue ctrl.Queue[string]
	m     *offloadMetrics

	watches *providerWatches

	mu     sync.Mutex
	phases map[string]v1alpha1.OffloadPhase // by namespace, for the gauge
	// written is, per namespace and NamespaceOffload, the status last
	// written and the version it was written onto.
	written map[string]map[types.UID]writtenStatus
}

// writtenStatus is a status written onto a NamespaceOffload at version
// from.
type writtenStatus struct {
	from   string
	status v1alpha1.NamespaceOffloadStatus
}

// syncProviders is the queue key that brings the provider watches in
// line with the credentials held; no namespace has an empty name.
const syncProviders = ""

// mirrorWorkers reconcile different keys (namespaces here, consumers on
// the provider's side) at once; a queue never hands one key to two.
const mirrorWorkers = 2

// NewConsumer checks cfg and prepares a Consumer; Run starts
// it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if cfg.Config == nil || cfg.Credentials == nil {
		return nil, errors.New("namespace offloading: the local REST config and the credentials are required")
	}
	if err := identity.ValidateClusterID(cfg.Self); err != nil {
		return nil, fmt.Errorf("namespace offloading: this cluster's ID: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sessions == nil {
		cfg.Sessions = remote.NewSessions(cfg.Credentials)
	}
	scheme := offload.MirrorScheme()
	// Namespaces are read whole, from the shared cache in an agent.
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("namespace offloading: scheme: %w", err)
	}
	mapper := offload.MirrorMapper()
	own, err := cache.New(cfg.Config, cache.Options{Scheme: scheme, Mapper: mapper, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("namespace offloading: cache: %w", err)
	}
	local := offload.WithShared(own, cfg.Peers, offload.SharedNamespaceOffloads, offload.SharedNamespaces)
	write, err := client.New(cfg.Config, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("namespace offloading: client: %w", err)
	}
	mc := &Consumer{
		cfg: cfg, log: cfg.Logger.With("component", "namespace-offload"),
		local: local, write: write,
		phases: map[string]v1alpha1.OffloadPhase{}, written: map[string]map[types.UID]writtenStatus{},
	}
	if mc.m, err = newOffloadMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("namespace offloading: metrics: %w", err)
	}
	mc.ctrl, err = ctrl.New(ctrl.Config[string]{
		Name: "namespace_offload", Workers: mirrorWorkers, Reconcile: mc.reconcileKey, Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[string]{Logger: mc.log,
			Failed: "namespace offloading not reconciled; retrying", Recovered: "namespace offloading reconciled again",
			Attrs: ctrl.Named[string]("namespace")},
		Failed: func(string, error) { mc.m.errors.Inc() },
	})
	if err != nil {
		return nil, fmt.Errorf("namespace offloading: %w", err)
	}
	mc.queue = mc.ctrl.Queue()
	mc.watches = newProviderWatches(mc.log, mc.providerChanged)
	return mc, nil
}

// Run watches NamespaceOffloads and Peers and reconciles until ctx ends;
// it returns once every goroutine it started (the provider watches too)
// has.
func (mc *Consumer) Run(ctx context.Context) error {
	// A namespace whose offload is not read yet would look unwanted and
	// lose its requests.
	return mc.ctrl.RunWithCache(ctx, ctrl.Start{
		What: "namespace offloading", Cache: mc.local,
		Watches: []ctrl.Watch{
			ctrl.On(&v1alpha1.NamespaceOffload{}, mc.offloadEvents()),
			ctrl.On(&v1alpha1.Peer{}, mc.peerEvents()),
			ctrl.On(&corev1.Namespace{}, mc.namespaceEvents()),
		},
		Synced: func(context.Context, *sync.WaitGroup) error {
			mc.queue.Add(syncProviders)
			return nil
		},
		Stopped: mc.watches.stopAll,
	})
}

// reconcileKey brings the provider watches in line, or one namespace.
func (mc *Consumer) reconcileKey(ctx context.Context, key string) (time.Duration, error) {
	if key == syncProviders {
		return 0, mc.syncWatches(ctx)
	}
	mc.m.reconciles.Inc()
	return 0, mc.reconcile(ctx, key)
}

// Offloads reads the NamespaceOffloads from the controller's cache, for
// the agent's dashboard; it answers once Run has started the cache.
func (mc *Consumer) Offloads() client.Reader { return mc.local }

// offloadEvents queues the namespace of a NamespaceOffload that changed.
func (mc *Consumer) offloadEvents() toolscache.ResourceEventHandler {
	return ctrl.OnEvery(func(obj any) {
		if o, ok := obj.(metav1.Object); ok {
			mc.queue.Add(o.GetNamespace())
		}
	})
}

// namespaceEvents queues a namespace whose LabelOffloaded is set or
// changes: its NamespaceOffload's Placement condition follows the label,
// which only an administrator sets.
func (mc *Consumer) namespaceEvents() toolscache.ResourceEventHandler {
	label := func(obj any) (string, bool) {
		m, ok := obj.(metav1.Object)
		if !ok {
			return "", false
		}
		v, ok := m.GetLabels()[offload.LabelOffloaded]
		return v, ok
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if _, ok := label(obj); ok {
				mc.queue.Add(obj.(metav1.Object).GetName())
			}
		},
		UpdateFunc: func(old, obj any) {
			v1, ok1 := label(old)
			v2, ok2 := label(obj)
			if v1 != v2 || ok1 != ok2 {
				mc.queue.Add(obj.(metav1.Object).GetName())
			}
		},
	}
}

// peerEvents queues every offloaded namespace, and the provider watches,
// when a Peer comes or goes, or its labels or credential change: what a
// selector picks and what can be reached follow from them. Other status
// changes (the peering's) are not ours.
func (mc *Consumer) peerEvents() toolscache.ResourceEventHandler {
	all := func() {
		mc.queue.Add(syncProviders)
		mc.queueOffloaded()
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { all() },
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*v1alpha1.Peer)
			n, ok2 := obj.(*v1alpha1.Peer)
			if !ok1 || !ok2 || !equalStrings(o.Labels, n.Labels) ||
				!sameCondition(meta.FindStatusCondition(o.Status.Conditions, v1alpha1.ConditionOffloadCredential),
					meta.FindStatusCondition(n.Status.Conditions, v1alpha1.ConditionOffloadCredential)) ||
				o.Status.ClusterName != n.Status.ClusterName {
				all()
			}
		},
		DeleteFunc: func(any) { all() },
	}
}

// queueOffloaded queues every namespace with a NamespaceOffload.
func (mc *Consumer) queueOffloaded() {
	var list v1alpha1.NamespaceOffloadList
	if err := mc.local.List(context.Background(), &list); err != nil {
		return // the cache is not started: its own events follow
	}
	for _, o := range list.Items {
		mc.queue.Add(o.Namespace)
	}
}

// providerChanged is told when a provider's watch syncs, changes
// reachability or sees a request change; it queues the namespaces
// concerned.
func (mc *Consumer) providerChanged(namespaces []string, all bool) {
	if all {
		mc.queueOffloaded()
	}
	for _, ns := range namespaces {
		if ns != "" {
			mc.queue.Add(ns)
		}
	}
}

// syncWatches keeps a watch on the requests of every provider whose
// credential this cluster holds, over the session with it; one
// restarted when its session changes, stopped when the credential goes.
func (mc *Consumer) syncWatches(ctx context.Context) error {
	var peers v1alpha1.PeerList // names only: uncopied, as NamespaceWatches reads them
	if err := mc.local.List(ctx, &peers, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list Peers: %w", err)
	}
	want := map[string]*remote.Session{}
	var errs []error
	for _, p := range peers.Items {
		s, err := mc.cfg.Sessions.Of(p.Name)
		switch {
		case err == nil:
			want[p.Name] = s
		case !errors.Is(err, remote.ErrNoCredential):
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, mc.watches.sync(want))...)
}

type offloadMetrics struct {
	reconciles, errors prometheus.Counter
	phases             *prometheus.GaugeVec
}

func newOffloadMetrics(reg prometheus.Registerer) (*offloadMetrics, error) {
	m := &offloadMetrics{
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_offload_consumer_reconciles_total", Help: "Reconciles of an offloaded namespace (consumer side)."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_offload_consumer_reconcile_errors_total", Help: "Reconciles of an offloaded namespace that failed and were retried."}),
		phases: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_offload_consumer_namespaces", Help: "Namespaces offloaded from this cluster, by phase."}, []string{"phase"}),
	}
	return m, ctrl.Register(reg, m.reconciles, m.errors, m.phases)
}

// setPhase counts namespace ns under phase p ("" when it is no longer
// offloaded).
func (mc *Consumer) setPhase(ns string, p v1alpha1.OffloadPhase) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	old, had := mc.phases[ns]
	if had && old == p {
		return
	}
	if had {
		mc.m.phases.WithLabelValues(string(old)).Dec()
		delete(mc.phases, ns)
	}
	if p != "" {
		mc.m.phases.WithLabelValues(string(p)).Inc()
		mc.phases[ns] = p
	}
}

func equalStrings(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// sameCondition compares what a condition says, not when.
func sameCondition(a, b *metav1.Condition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message && a.ObservedGeneration == b.ObservedGeneration
}
