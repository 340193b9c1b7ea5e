package offload

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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
)

// DefaultPodWorkers is how many pods a PodReflector reconciles at once
// when its config says nothing. A pod costs about two API round trips (a
// create there, a status write here) that wait on the API servers, not
// on us; more workers than this lose the queue's folding of a pod's
// changes into one write (docs/offload.md, "Offloaded pods").
const DefaultPodWorkers = 16

// podFieldManager writes remote pods and local pods' status.
const podFieldManager = "flotilla"

// PodReflectorConfig is what a PodReflector needs.
type PodReflectorConfig struct {
	// Config reaches the local API server: the pods bound to virtual
	// nodes, their status and events, NamespaceOffloads and Peers.
	Config *rest.Config
	// Self is this cluster's ID: every remote pod carries it as
	// LabelTenant.
	Self        string
	Credentials Credentials
	// Views translates the providers' pod IPs into this cluster's view.
	Views Views
	// Address is the virtual nodes' InternalIP (the agent's address):
	// the host IP of every offloaded pod.
	Address netip.Addr
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// Workers is how many pods are reconciled at once (DefaultPodWorkers
	// when zero), whatever the number of providers.
	Workers int
}

// PodReflector runs the pods bound to virtual nodes on their providers:
// each is created, with the consumer's credential, in the namespace
// mirrored for its namespace there, and the provider's pod's status comes
// back, its IP translated into this cluster's view. It is level-triggered
// between two API servers: a reconcile of one pod reads the local pod,
// the NamespaceOffload and the remote pod from informers on both sides,
// never from memory of what it did, so a restart converges without
// deleting or duplicating anything.
type PodReflector struct {
	cfg   PodReflectorConfig
	log   *slog.Logger
	kube  kubernetes.Interface // local writes: status, deletion, events
	watch kubernetes.Interface // local informers (no timeout)
	local cache.Cache          // NamespaceOffloads and Peers
	queue workqueue.TypedRateLimitingInterface[podKey]
	m     *podMetrics

	events record.EventBroadcaster
	// resync asks for the providers and their namespaces to be brought in
	// line with the Peers, credentials and NamespaceOffloads.
	resync chan struct{}

	mu        sync.Mutex
	providers map[string]*podProvider
	// dirty are local namespaces whose NamespaceOffloads changed: their
	// pods are queued once the namespace watches follow.
	dirty map[string]bool

	changesMu sync.Mutex
	since     map[podKey]time.Time // the first change not yet looked at
	acting    map[podKey]time.Time // since of the reconcile under way
	lastErr   map[podKey]string    // log an error once per change
}

// podKey names a local pod and the provider whose virtual node it is
// bound to: a pod of the same name may come back bound to another.
type podKey struct {
	provider, namespace, name string
}

func (k podKey) String() string { return k.namespace + "/" + k.name + "@" + k.provider }

// NewPodReflector checks cfg and prepares a PodReflector; Run starts it.
func NewPodReflector(cfg PodReflectorConfig) (*PodReflector, error) {
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
	kube, err := kubernetes.NewForConfig(cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("pod offloading: client: %w", err)
	}
	wcfg := rest.CopyConfig(cfg.Config)
	wcfg.Timeout = 0 // or the watches are cut
	watch, err := kubernetes.NewForConfig(wcfg)
	if err != nil {
		return nil, fmt.Errorf("pod offloading: client: %w", err)
	}
	local, err := cache.New(cfg.Config, cache.Options{Scheme: mirrorScheme(), Mapper: mirrorMapper(), DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("pod offloading: cache: %w", err)
	}
	r := &PodReflector{
		cfg: cfg, log: cfg.Logger.With("component", "pod-offload"),
		kube: kube, watch: watch, local: local,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[podKey](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[podKey]{Name: "pod-offload"}),
		resync:    make(chan struct{}, 1),
		providers: map[string]*podProvider{}, dirty: map[string]bool{},
		since: map[podKey]time.Time{}, acting: map[podKey]time.Time{}, lastErr: map[podKey]string{},
	}
	if r.m, err = newPodMetrics(cfg.Metrics, r); err != nil {
		return nil, fmt.Errorf("pod offloading: metrics: %w", err)
	}
	return r, nil
}

// Run reflects pods until ctx ends; it returns once every goroutine it
// started (the providers' informers too) has.
func (r *PodReflector) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	r.events = record.NewBroadcaster(record.WithContext(ctx))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		r.queue.ShutDown()
		wg.Wait()
		r.stopProviders()
		r.events.Shutdown()
	}()
	r.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.kube.CoreV1().Events("")})
	offloads, err := r.local.GetInformer(ctx, &v1alpha1.NamespaceOffload{})
	if err != nil {
		return fmt.Errorf("pod offloading: watch NamespaceOffloads: %w", err)
	}
	peers, err := r.local.GetInformer(ctx, &v1alpha1.Peer{})
	if err != nil {
		return fmt.Errorf("pod offloading: watch Peers: %w", err)
	}
	regOffloads, err := offloads.AddEventHandler(r.offloadEvents())
	if err != nil {
		return fmt.Errorf("pod offloading: watch NamespaceOffloads: %w", err)
	}
	regPeers, err := peers.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.triggerSync() },
		UpdateFunc: func(any, any) { r.triggerSync() },
		DeleteFunc: func(any) { r.triggerSync() },
	})
	if err != nil {
		return fmt.Errorf("pod offloading: watch Peers: %w", err)
	}
	// A pod whose NamespaceOffload is not read yet would look not
	// offloaded and be refused.
	cacheErr, synced, err := startCache(ctx, &wg, r.local, "pod offloading", regOffloads, regPeers)
	if !synced {
		return err
	}
	r.triggerSync()
	wg.Go(func() { r.syncLoop(ctx) })
	return work(ctx, &wg, r.cfg.Workers, r.next, cacheErr, "pod offloading")
}

func (r *PodReflector) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	r.startPass(key)
	err := r.reconcile(ctx, key)
	// Not listed yet: the watch queues the pod once it is, and the time
	// it took counts in the lag.
	listing := errors.Is(err, errNotListed)
	if listing {
		err = nil
	}
	r.endPass(key, err != nil || listing)
	if ctx.Err() != nil {
		return true
	}
	r.noteError(key, err)
	if err != nil {
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// startPass takes the time of key's first change for the reconcile about
// to run: a change seen while it runs starts the next one's.
func (r *PodReflector) startPass(key podKey) {
	r.changesMu.Lock()
	defer r.changesMu.Unlock()
	if t, ok := r.since[key]; ok {
		r.acting[key] = t
		delete(r.since, key)
	}
}

// endPass keeps the time of a change not acted on for the next
// reconcile of key (keep: this one failed, or could not look yet); one
// that found nothing to do forgets it.
func (r *PodReflector) endPass(key podKey, keep bool) {
	r.changesMu.Lock()
	defer r.changesMu.Unlock()
	t, ok := r.acting[key]
	delete(r.acting, key)
	if ok && keep {
		if later, seen := r.since[key]; !seen || t.Before(later) {
			r.since[key] = t
		}
	}
}

// changed queues key; a change seen live (not an informer's first list)
// starts its reflection lag.
func (r *PodReflector) changed(key podKey, initial bool) {
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
func (r *PodReflector) acted(kind string, key podKey) {
	r.changesMu.Lock()
	t, ok := r.acting[key]
	delete(r.acting, key)
	r.changesMu.Unlock()
	if ok {
		r.m.lag.WithLabelValues(kind, key.provider).Observe(time.Since(t).Seconds())
	}
}

// noteError logs a pod's error once per change; a provider that does not
// answer is logged once by its watch, not once per pod.
func (r *PodReflector) noteError(key podKey, err error) {
	r.changesMu.Lock()
	defer r.changesMu.Unlock()
	was := r.lastErr[key]
	switch {
	case err == nil && was != "":
		delete(r.lastErr, key)
		r.log.Info("pod reflected again", "pod", key.namespace+"/"+key.name, "peer", key.provider)
	case err != nil && was != err.Error():
		r.lastErr[key] = err.Error()
		level := slog.LevelWarn
		var pe *providerError
		switch {
		case errors.As(err, &pe) && pe.reason == errUnreachable, errors.As(err, new(retryLater)), apierrors.IsConflict(err):
			// Said once by the provider's watch; a wait; a cache behind.
			level = slog.LevelDebug
		}
		r.log.Log(context.Background(), level, "pod not reflected; retrying", "pod", key.namespace+"/"+key.name, "peer", key.provider, "err", err)
	}
}

func (r *PodReflector) triggerSync() {
	select {
	case r.resync <- struct{}{}:
	default:
	}
}

// offloadEvents note the namespace of a NamespaceOffload that changed:
// its pods are queued once the namespace watches follow the change.
func (r *PodReflector) offloadEvents() toolscache.ResourceEventHandler {
	return onEvery(func(obj any) {
		if o, ok := obj.(*v1alpha1.NamespaceOffload); ok {
			r.mu.Lock()
			r.dirty[o.Namespace] = true
			r.mu.Unlock()
			r.triggerSync()
		}
	})
}

// providerResync is how often the providers are brought in line without
// an event: a credential can come or go without its Peer changing (the
// grants kept from before loaded at the agent's start, an expiry).
const providerResync = 10 * time.Second

// syncLoop brings the providers in line whenever asked, every
// providerResync, and again a little later when that failed.
func (r *PodReflector) syncLoop(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	resync := time.NewTicker(providerResync)
	defer resync.Stop()
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.resync:
		case <-resync.C:
		case <-retry.C:
		}
		err := r.syncProviders(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if err.Error() != last {
				r.log.Warn("providers' pod watches not in line; retrying", "err", err)
			}
			last = err.Error()
			retry.Reset(5 * time.Second)
		case err == nil && last != "":
			r.log.Info("providers' pod watches in line again")
			last = ""
		}
	}
}

// syncProviders keeps a podProvider for every Peer whose credential this
// cluster holds, watching the namespaces mirrored there, and queues the
// pods of the namespaces whose offloading changed.
func (r *PodReflector) syncProviders(ctx context.Context) error {
	var peers v1alpha1.PeerList
	if err := r.local.List(ctx, &peers); err != nil {
		return fmt.Errorf("list Peers: %w", err)
	}
	var offloads v1alpha1.NamespaceOffloadList
	if err := r.local.List(ctx, &offloads); err != nil {
		return fmt.Errorf("list NamespaceOffloads: %w", err)
	}
	want := map[string]providerCredential{}
	for _, p := range peers.Items {
		if p.Name == r.cfg.Self || identity.ValidateClusterID(p.Name) != nil {
			continue
		}
		if cfg, g, err := r.cfg.Credentials.Credential(p.Name); err == nil {
			want[p.Name] = providerCredential{config: cfg, grant: g}
		}
	}
	var stopping []*podProvider
	r.mu.Lock()
	for id, pp := range r.providers {
		if c, ok := want[id]; !ok || !pp.sameEndpoint(c) {
			stopping = append(stopping, pp)
			delete(r.providers, id)
		}
	}
	r.mu.Unlock()
	for _, pp := range stopping {
		pp.stop()
		r.log.Info("stopped reflecting pods to a provider", "peer", pp.id)
	}
	var errs []error
	for id, c := range want {
		if r.provider(id) != nil {
			continue
		}
		pp, err := r.startProvider(id, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		r.providers[id] = pp
		r.mu.Unlock()
		r.log.Info("reflecting pods to a provider", "peer", id, "node", pp.node, "server", c.grant.Server)
	}
	r.mu.Lock()
	dirty := r.dirty
	r.dirty = map[string]bool{}
	r.mu.Unlock()
	for _, pp := range r.allProviders() {
		pp.syncNamespaces(watchedNamespaces(offloads.Items, pp.id, pp.watching()))
		for ns := range dirty {
			pp.queueNamespace(ns)
		}
	}
	return errors.Join(errs...)
}

// watchedNamespaces are the namespaces to watch on provider (remote name
// -> local name): those mirrored there and ready, and those already
// watched that are still mirrored (a provider unreachable for a while
// keeps its watch and cache). A NamespaceOffload being deleted counts for
// nothing: its namespaces are going.
func watchedNamespaces(offloads []v1alpha1.NamespaceOffload, provider string, watching map[string]string) map[string]string {
	want := map[string]string{}
	for i := range offloads {
		o := &offloads[i]
		if o.DeletionTimestamp != nil {
			continue
		}
		name, ready := MirroredNamespace(o, provider)
		switch {
		case name == "":
		case ready:
			want[name] = o.Namespace
		case watching[name] == o.Namespace:
			if _, taken := want[name]; !taken {
				want[name] = o.Namespace
			}
		}
	}
	return want
}

func (r *PodReflector) provider(id string) *podProvider {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.providers[id]
}

func (r *PodReflector) allProviders() []*podProvider {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*podProvider, 0, len(r.providers))
	for _, pp := range r.providers {
		out = append(out, pp)
	}
	return out
}

func (r *PodReflector) stopProviders() {
	r.mu.Lock()
	all := r.providers
	r.providers = map[string]*podProvider{}
	r.mu.Unlock()
	for _, pp := range all {
		pp.stop()
	}
}

// recorder records events on local pods as the virtual node of provider,
// as a kubelet records them as its node.
func (r *PodReflector) recorder(provider string) record.EventRecorder {
	return r.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "flotilla", Host: VirtualNodeName(provider)})
}
