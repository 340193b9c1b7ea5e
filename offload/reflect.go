package offload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
)

// DefaultReflectWorkers is how many objects a Reflector reconciles at
// once when its config says nothing: each is a write that waits on a
// provider's API server.
const DefaultReflectWorkers = 8

// reflectFieldManager writes reflected objects and the Reflected
// condition: a manager of its own, so the condition and the mirror
// controller's Ready do not take each other's fields.
const reflectFieldManager = "flotilla-reflection"

// ReflectorConfig is what a Reflector needs.
type ReflectorConfig struct {
	// Config reaches the local API server: the objects reflected, the
	// pods bound to virtual nodes, NamespaceOffloads and Peers.
	Config      *rest.Config
	Self        string
	Credentials Credentials
	// Views translates endpoint addresses into each provider's terms.
	Views   Views
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// Workers is how many objects are reconciled at once
	// (DefaultReflectWorkers when zero).
	Workers int
}

// Reflector copies what offloaded pods need into the namespaces mirrored
// for this cluster on its providers (docs/services.md, "Reflection"):
// the ConfigMaps and Secrets the pods bound to a provider's virtual node
// reference (or that opt in with AnnotationReflect), and the Services of
// offloaded namespaces with their EndpointSlices, addresses translated.
// Like the PodReflector it is level-triggered between two API servers:
// a reconcile reads the local object and its reflection from informers
// on both sides, so a restart converges without duplicating anything.
type Reflector struct {
	cfg   ReflectorConfig
	log   *slog.Logger
	local cache.Cache   // everything read here
	write client.Client // the Reflected condition
	queue workqueue.TypedRateLimitingInterface[reflectKey]
	m     *reflectMetrics

	resync chan struct{}

	mu        sync.Mutex
	providers map[string]*reflectProvider
	dirty     map[string]bool // namespaces whose NamespaceOffloads changed

	stateMu sync.Mutex
	// foreign are the objects found in the way, per provider and local
	// namespace: "Kind/name" -> true.
	foreign map[nsOnProvider]map[string]bool
	since   map[reflectKey]time.Time // first change not yet acted on
	lastErr map[reflectKey]string
}

// reflectKey names a local object and the provider it is reflected to
// (kind kindStatus: the Reflected condition of namespace there).
type reflectKey struct {
	provider, kind, namespace, name string
}

func (k reflectKey) String() string {
	return k.kind + " " + k.namespace + "/" + k.name + "@" + k.provider
}

type nsOnProvider struct{ provider, namespace string }

// reflectScheme and reflectMapper know every kind a Reflector reads or
// writes, so neither cache nor client asks the API server first.
func reflectScheme() *runtime.Scheme {
	s := mirrorScheme()
	if err := errors.Join(corev1.AddToScheme(s), discoveryv1.AddToScheme(s)); err != nil {
		panic(err)
	}
	return s
}

func reflectMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	m.Add(v1alpha1.GroupVersion.WithKind("NamespaceOffload"), meta.RESTScopeNamespace)
	for _, k := range []string{"Pod", kindConfigMap, kindSecret, kindService} {
		m.Add(corev1.SchemeGroupVersion.WithKind(k), meta.RESTScopeNamespace)
	}
	m.Add(discoveryv1.SchemeGroupVersion.WithKind(kindEndpointSlice), meta.RESTScopeNamespace)
	// A cache of several namespaces asks the scope of the list's kind
	// (controller-runtime's multi-namespace cache).
	m.Add(discoveryv1.SchemeGroupVersion.WithKind(kindEndpointSlice+"List"), meta.RESTScopeNamespace)
	return m
}

// podRefsIndex indexes the pods bound to virtual nodes by what they
// reference there: "<provider>/<kind>/<name>".
const podRefsIndex = "flotilla.reflect.refs"

func podRefKey(provider, kind, name string) string { return provider + "/" + kind + "/" + name }

// NewReflector checks cfg and prepares a Reflector; Run starts it.
func NewReflector(cfg ReflectorConfig) (*Reflector, error) {
	if cfg.Config == nil || cfg.Credentials == nil || cfg.Views == nil {
		return nil, errors.New("reflection: the local REST config, the credentials and the views are required")
	}
	if err := identity.ValidateClusterID(cfg.Self); err != nil {
		return nil, fmt.Errorf("reflection: this cluster's ID: %w", err)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultReflectWorkers
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	local, err := cache.New(cfg.Config, cache.Options{
		Scheme: reflectScheme(), Mapper: reflectMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: podForReferences}},
	})
	if err != nil {
		return nil, fmt.Errorf("reflection: cache: %w", err)
	}
	if err := local.IndexField(context.Background(), &corev1.Pod{}, podRefsIndex, indexPodRefs); err != nil {
		return nil, fmt.Errorf("reflection: index pods: %w", err)
	}
	write, err := client.New(cfg.Config, client.Options{Scheme: reflectScheme(), Mapper: reflectMapper()})
	if err != nil {
		return nil, fmt.Errorf("reflection: client: %w", err)
	}
	r := &Reflector{
		cfg: cfg, log: cfg.Logger.With("component", "reflection"),
		local: local, write: write,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[reflectKey](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[reflectKey]{Name: "reflection"}),
		resync:    make(chan struct{}, 1),
		providers: map[string]*reflectProvider{}, dirty: map[string]bool{},
		foreign: map[nsOnProvider]map[string]bool{},
		since:   map[reflectKey]time.Time{}, lastErr: map[reflectKey]string{},
	}
	if r.m, err = newReflectMetrics(cfg.Metrics, r); err != nil {
		return nil, fmt.Errorf("reflection: metrics: %w", err)
	}
	return r, nil
}

// podForReferences keeps of a pod what says where it runs and what it
// references: a cluster's pods are held once more, so only that.
func podForReferences(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Env: c.Env, EnvFrom: c.EnvFrom}
		}
		return out
	}
	p.ManagedFields, p.Annotations, p.Status = nil, nil, corev1.PodStatus{}
	p.Spec = corev1.PodSpec{
		NodeName: p.Spec.NodeName, Volumes: p.Spec.Volumes, ImagePullSecrets: p.Spec.ImagePullSecrets,
		InitContainers: slim(p.Spec.InitContainers), Containers: slim(p.Spec.Containers),
	}
	return p, nil
}

func indexPodRefs(obj client.Object) []string {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	provider := providerOfNode(p.Spec.NodeName)
	if provider == "" || p.DeletionTimestamp != nil && terminal(p) {
		return nil
	}
	var out []string
	for _, ref := range podRefs(p) {
		out = append(out, podRefKey(provider, ref.kind, ref.name))
	}
	return out
}

// Run reflects until ctx ends; it returns once every goroutine it
// started (the providers' informers too) has.
func (r *Reflector) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		r.queue.ShutDown()
		wg.Wait()
		r.stopProviders()
	}()
	handlers := []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{
		{&v1alpha1.NamespaceOffload{}, onEvery(func(obj any) {
			if o, ok := obj.(*v1alpha1.NamespaceOffload); ok {
				r.mu.Lock()
				r.dirty[o.Namespace] = true
				r.mu.Unlock()
				r.triggerSync()
			}
		})},
		{&v1alpha1.Peer{}, onEvery(func(any) { r.triggerSync() })},
		{&corev1.Pod{}, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.podChanged(obj) },
			UpdateFunc: func(old, obj any) { r.podChanged(old); r.podChanged(obj) },
			DeleteFunc: func(obj any) { r.podChanged(obj) },
		}},
		{&corev1.ConfigMap{}, onEvery(func(obj any) { r.localChanged(kindConfigMap, obj) })},
		{&corev1.Secret{}, onEvery(func(obj any) { r.localChanged(kindSecret, obj) })},
		{&corev1.Service{}, onEvery(func(obj any) { r.localChanged(kindService, obj) })},
		{&discoveryv1.EndpointSlice{}, onEvery(func(obj any) { r.localChanged(kindEndpointSlice, obj) })},
	}
	var regs []toolscache.ResourceEventHandlerRegistration
	for _, h := range handlers {
		inf, err := r.local.GetInformer(ctx, h.obj)
		if err != nil {
			return fmt.Errorf("reflection: watch %T: %w", h.obj, err)
		}
		reg, err := inf.AddEventHandler(h.h)
		if err != nil {
			return fmt.Errorf("reflection: watch %T: %w", h.obj, err)
		}
		regs = append(regs, reg)
	}
	// A reference not read yet would make its object look unreferenced,
	// and its reflection be deleted.
	cacheErr, synced, err := startCache(ctx, &wg, r.local, "reflection", regs...)
	if !synced {
		return err
	}
	r.triggerSync()
	wg.Go(func() { r.syncLoop(ctx) })
	return work(ctx, &wg, r.cfg.Workers, r.next, cacheErr, "reflection")
}

// podChanged queues what a pod bound to a virtual node references.
func (r *Reflector) podChanged(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	provider := providerOfNode(p.Spec.NodeName)
	if provider == "" {
		return
	}
	for _, ref := range podRefs(p) {
		r.changed(reflectKey{provider: provider, kind: ref.kind, namespace: p.Namespace, name: ref.name})
	}
}

// localChanged queues a local object for every provider.
func (r *Reflector) localChanged(kind string, obj any) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	for _, pp := range r.allProviders() {
		r.changed(reflectKey{provider: pp.id, kind: kind, namespace: o.GetNamespace(), name: o.GetName()})
	}
}

// changed queues key, and starts its reflection lag unless a change
// before is still waiting.
func (r *Reflector) changed(key reflectKey) {
	r.stateMu.Lock()
	if _, ok := r.since[key]; !ok {
		r.since[key] = time.Now()
	}
	r.stateMu.Unlock()
	r.queue.Add(key)
}

func (r *Reflector) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	r.stateMu.Lock()
	t, timed := r.since[key]
	delete(r.since, key)
	r.stateMu.Unlock()
	wrote, err := r.reconcileWithThird(ctx, key)
	if ctx.Err() != nil {
		return true
	}
	switch {
	case wrote && timed:
		r.m.lag.WithLabelValues(key.kind, key.provider).Observe(time.Since(t).Seconds())
	case err != nil && timed:
		r.stateMu.Lock()
		if later, ok := r.since[key]; !ok || t.Before(later) {
			r.since[key] = t
		}
		r.stateMu.Unlock()
	}
	r.noteError(key, err)
	if err != nil {
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// noteError logs an object's error once per change.
func (r *Reflector) noteError(key reflectKey, err error) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	was := r.lastErr[key]
	switch {
	case err == nil && was != "":
		delete(r.lastErr, key)
		r.log.Info("reflected again", "object", key.kind+" "+key.namespace+"/"+key.name, "peer", key.provider)
	case err != nil && was != err.Error():
		r.lastErr[key] = err.Error()
		level := slog.LevelWarn
		if errors.As(err, new(retryLater)) {
			level = slog.LevelDebug
		}
		r.log.Log(context.Background(), level, "not reflected; retrying", "object", key.kind+" "+key.namespace+"/"+key.name, "peer", key.provider, "err", err)
	}
}

func (r *Reflector) triggerSync() {
	select {
	case r.resync <- struct{}{}:
	default:
	}
}

// syncLoop brings the providers in line whenever asked, every
// providerResync (a credential can come or go without an event), and
// again a little later when that failed.
func (r *Reflector) syncLoop(ctx context.Context) {
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
				r.log.Warn("providers' reflection not in line; retrying", "err", err)
			}
			last = err.Error()
			retry.Reset(5 * time.Second)
		case err == nil && last != "":
			r.log.Info("providers' reflection in line again")
			last = ""
		}
	}
}

// syncProviders keeps a reflectProvider for every Peer whose credential
// this cluster holds, watching what is reflected in the namespaces
// mirrored there, and queues the objects of namespaces whose offloading
// changed.
func (r *Reflector) syncProviders(ctx context.Context) error {
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
	var stopping []*reflectProvider
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
		r.log.Info("stopped reflecting to a provider", "peer", pp.id)
	}
	var errs []error
	for id, c := range want {
		if r.provider(id) != nil {
			continue
		}
		pp, err := r.newProvider(id, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		r.providers[id] = pp
		r.mu.Unlock()
		r.log.Info("reflecting to a provider", "peer", id, "server", c.grant.Server)
	}
	r.mu.Lock()
	dirty := r.dirty
	r.dirty = map[string]bool{}
	r.mu.Unlock()
	for _, pp := range r.allProviders() {
		errs = append(errs, pp.syncNamespaces(watchedNamespaces(offloads.Items, pp.id, pp.watching())))
		for ns := range dirty {
			r.queueNamespace(pp.id, ns)
		}
	}
	return errors.Join(errs...)
}

// queueNamespace queues every local object of ns that may be reflected
// to provider, and the namespace's condition there.
func (r *Reflector) queueNamespace(provider, ns string) {
	ctx := context.Background()
	lists := []struct {
		kind string
		list client.ObjectList
	}{
		{kindConfigMap, &corev1.ConfigMapList{}}, {kindSecret, &corev1.SecretList{}},
		{kindService, &corev1.ServiceList{}}, {kindEndpointSlice, &discoveryv1.EndpointSliceList{}},
	}
	for _, l := range lists {
		if err := r.local.List(ctx, l.list, client.InNamespace(ns)); err != nil {
			continue
		}
		_ = meta.EachListItem(l.list, func(obj runtime.Object) error {
			if o, ok := obj.(client.Object); ok {
				r.queue.Add(reflectKey{provider: provider, kind: l.kind, namespace: ns, name: o.GetName()})
			}
			return nil
		})
	}
	r.queue.Add(reflectKey{provider: provider, kind: kindStatus, namespace: ns})
}

func (r *Reflector) provider(id string) *reflectProvider {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.providers[id]
}

func (r *Reflector) allProviders() []*reflectProvider {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*reflectProvider, 0, len(r.providers))
	for _, pp := range r.providers {
		out = append(out, pp)
	}
	return out
}

func (r *Reflector) stopProviders() {
	r.mu.Lock()
	all := r.providers
	r.providers = map[string]*reflectProvider{}
	r.mu.Unlock()
	for _, pp := range all {
		pp.stop()
	}
}
