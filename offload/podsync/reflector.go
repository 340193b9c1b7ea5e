package podsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// DefaultPodWorkers is how many pods a Reflector reconciles at once
// when its config says nothing. A pod costs about two API round trips (a
// create there, a status write here) that wait on the API servers, not
// on us; more workers than this lose the queue's folding of a pod's
// changes into one write (docs/offload.md, "Offloaded pods").
const DefaultPodWorkers = 16

// podFieldManager writes remote pods and local pods' status.
const podFieldManager = "flotilla"

// Config is what a Reflector needs.
type Config struct {
	// Config reaches the local API server: the pods bound to virtual
	// nodes, their status and events, NamespaceOffloads and Peers.
	Config *rest.Config
	// Self is this cluster's ID: every remote pod carries it as
	// LabelTenant.
	Self        string
	Credentials remote.Credentials
	// Sessions, when set, are the sessions with the providers shared
	// with the agent's other components; sessions of its own over
	// Credentials when nil.
	Sessions *remote.Sessions
	// Views translates the providers' pod IPs into this cluster's view.
	Views offload.Views
	// Address is the virtual nodes' InternalIP (the agent's address):
	// the host IP of every offloaded pod.
	Address netip.Addr
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// Workers is how many pods are reconciled at once (DefaultPodWorkers
	// when zero), whatever the number of providers.
	Workers int
	// Peers, when set, is where Peers are read and watched, shared with
	// the agent's other components (PeerCache); a cache of its own when
	// nil.
	Peers offload.PeerCache
}

// Reflector runs the pods bound to virtual nodes on their providers:
// each is created, with the consumer's credential, in the namespace
// mirrored for its namespace there, and the provider's pod's status comes
// back, its IP translated into this cluster's view. It is level-triggered
// between two API servers: a reconcile of one pod reads the local pod,
// the NamespaceOffload and the remote pod from informers on both sides,
// never from memory of what it did, so a restart converges without
// deleting or duplicating anything.
type Reflector struct {
	cfg   Config
	log   *slog.Logger
	kube  typedcorev1.CoreV1Interface // local writes: status, deletion, events
	watch typedcorev1.CoreV1Interface // local informers (no timeout)
	local cache.Cache                 // NamespaceOffloads and Peers
	ctrl  *ctrl.Controller[podKey]
	queue ctrl.Queue[podKey]
	m     *podMetrics

	events record.EventBroadcaster
	// providers watch the pods in the namespaces mirrored on each
	// provider.
	providers *remote.NamespaceWatches[*podProvider]

	changesMu sync.Mutex
	since     map[podKey]time.Time // the first change not yet looked at
	acting    map[podKey]time.Time // since of the reconcile under way
}

// podKey names a local pod and the provider whose virtual node it is
// bound to: a pod of the same name may come back bound to another.
type podKey struct {
	provider, namespace, name string
}

func (k podKey) String() string { return k.namespace + "/" + k.name + "@" + k.provider }

// NewReflector checks cfg and prepares a Reflector; Run starts it.
func NewReflector(cfg Config) (*Reflector, error) {
	if cfg.Config == nil || cfg.Credentials == nil || cfg.Views == nil {
		return nil, errors.New("pod offloading: the local REST config, the credentials and the views are required")
	}
	if err := identity.ValidateClusterID(cfg.Self); err != nil {
		return nil, fmt.Errorf("pod offloading: this cluster's ID: %w", err)
	}
	if !cfg.Address.IsValid() {
		return nil, errors.New("pod offloading: no address for the virtual nodes: set the agent's node address (the host IP of offloaded pods)")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultPodWorkers
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sessions == nil {
		cfg.Sessions = remote.NewSessions(cfg.Credentials)
	}
	kube, err := typedcorev1.NewForConfig(cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("pod offloading: client: %w", err)
	}
	wcfg := rest.CopyConfig(cfg.Config)
	wcfg.Timeout = 0 // or the watches are cut
	watch, err := typedcorev1.NewForConfig(wcfg)
	if err != nil {
		return nil, fmt.Errorf("pod offloading: client: %w", err)
	}
	own, err := cache.New(cfg.Config, cache.Options{Scheme: offload.MirrorScheme(), Mapper: offload.MirrorMapper(), DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("pod offloading: cache: %w", err)
	}
	local := offload.WithShared(own, cfg.Peers, offload.SharedNamespaceOffloads)
	r := &Reflector{
		cfg: cfg, log: cfg.Logger.With("component", "pod-offload"),
		kube: kube, watch: watch, local: local,
		since: map[podKey]time.Time{}, acting: map[podKey]time.Time{},
	}
	r.ctrl, err = ctrl.New(ctrl.Config[podKey]{
		Name: "pod_offload", Workers: cfg.Workers, MaxDelay: 30 * time.Second, Reconcile: r.reconcilePass, Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[podKey]{Logger: r.log, Failed: "pod not reflected; retrying", Recovered: "pod reflected again",
			Attrs: func(k podKey) []any { return []any{"pod", k.namespace + "/" + k.name, "peer", k.provider} },
			Level: podErrorLevel},
	})
	if err != nil {
		return nil, fmt.Errorf("pod offloading: %w", err)
	}
	r.queue = r.ctrl.Queue()
	r.providers = remote.NewNamespaceWatches(cfg.Self, cfg.Sessions, local, r.log, "pods", r.startProvider, (*podProvider).queueNamespace)
	if r.m, err = newPodMetrics(cfg.Metrics, r); err != nil {
		return nil, fmt.Errorf("pod offloading: metrics: %w", err)
	}
	return r, nil
}

// Run reflects pods until ctx ends; it returns once every goroutine it
// started (the providers' informers too) has.
func (r *Reflector) Run(ctx context.Context) error {
	r.events = record.NewBroadcaster(record.WithContext(ctx))
	r.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.kube.Events("")})
	// A pod whose NamespaceOffload is not read yet would look not
	// offloaded and be refused.
	return r.ctrl.RunWithCache(ctx, ctrl.Start{
		What: "pod offloading", Cache: r.local,
		Watches: []ctrl.Watch{
			ctrl.On(&v1alpha1.NamespaceOffload{}, r.offloadEvents()),
			ctrl.On(&v1alpha1.Peer{}, ctrl.OnEvery(func(any) { r.providers.Trigger() })),
		},
		Synced: func(ctx context.Context, wg *sync.WaitGroup) error {
			r.providers.Trigger()
			wg.Go(func() { r.providers.Loop(ctx) })
			return nil
		},
		Stopped: func() {
			r.providers.StopAll()
			r.events.Shutdown()
		},
	})
}

// reconcilePass reconciles key, timing the changes it acts on.
func (r *Reflector) reconcilePass(ctx context.Context, key podKey) (time.Duration, error) {
	r.startPass(key)
	err := r.reconcile(ctx, key)
	// Not listed yet: the watch queues the pod once it is, and the time
	// it took counts in the lag.
	listing := errors.Is(err, offload.ErrNotListed)
	if listing {
		err = nil
	}
	r.endPass(key, err != nil || listing)
	return 0, err
}

// startPass takes the time of key's first change for the reconcile about
// to run: a change seen while it runs starts the next one's.
func (r *Reflector) startPass(key podKey) {
	r.changesMu.Lock()
	defer r.changesMu.Unlock()
	if t, ok := r.since[key]; ok {
		r.acting[key] = t
		forget(&r.since, key)
	}
}

// forget deletes key from *m, and makes *m anew once it is empty: a Go
// map keeps the room of the most it ever held, a ramp's thousand pods.
func forget(m *map[podKey]time.Time, key podKey) {
	delete(*m, key)
	if len(*m) == 0 {
		*m = map[podKey]time.Time{}
	}
}

// endPass keeps the time of a change not acted on for the next
// reconcile of key (keep: this one failed, or could not look yet); one
// that found nothing to do forgets it.
func (r *Reflector) endPass(key podKey, keep bool) {
	r.changesMu.Lock()
	defer r.changesMu.Unlock()
	t, ok := r.acting[key]
	forget(&r.acting, key)
	if ok && keep {
		if later, seen := r.since[key]; !seen || t.Before(later) {
			r.since[key] = t
		}
	}
}

// changed queues key; a change seen live (not an informer's first list)
// starts its reflection lag.
func (r *Reflector) changed(key podKey, initial bool) {
	if !initial {
		r.changesMu.Lock()
		if _, ok := r.since[key]; !ok {
			r.since[key] = time.Now()
		}
		r.changesMu.Unlock()
	}
	r.queue.Add(key)
}

// Reflection lag kinds: "pod" is an effect on the provider (its pod
// created or deleted), "podstatus" one on this cluster (a pod's status
// written, or its deletion confirmed).
const (
	lagPod       = "pod"
	lagPodStatus = "podstatus"
)

// acted records the lag from the first change the reconcile under way
// acts on to now.
func (r *Reflector) acted(kind string, key podKey) {
	r.changesMu.Lock()
	t, ok := r.acting[key]
	forget(&r.acting, key)
	r.changesMu.Unlock()
	if ok {
		r.m.lag.WithLabelValues(kind, key.provider).Observe(time.Since(t).Seconds())
	}
}

// podErrorLevel: a provider that does not answer is logged once by its
// watch, not once per pod; a wait and a cache behind are not news.
func podErrorLevel(err error) slog.Level {
	var pe *offload.ProviderError
	switch {
	case errors.As(err, &pe) && pe.Reason == offload.ErrUnreachable, errors.As(err, new(offload.RetryLater)), apierrors.IsConflict(err):
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// offloadEvents note the namespace of a NamespaceOffload that changed:
// its pods are queued once the namespace watches follow the change.
func (r *Reflector) offloadEvents() toolscache.ResourceEventHandler {
	return ctrl.OnEvery(func(obj any) {
		if o, ok := obj.(*v1alpha1.NamespaceOffload); ok {
			r.providers.OffloadChanged(o.Namespace)
		}
	})
}

// provider is the watch of provider's pods, nil when there is none.
func (r *Reflector) provider(id string) *podProvider {
	pp, _ := r.providers.Get(id)
	return pp
}

// recorder records events on local pods as the virtual node of provider,
// as a kubelet records them as its node.
func (r *Reflector) recorder(provider string) record.EventRecorder {
	return r.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "flotilla", Host: offload.VirtualNodeName(provider)})
}
