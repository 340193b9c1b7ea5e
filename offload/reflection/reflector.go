package reflection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	Credentials remote.Credentials
	// Sessions, when set, are the sessions with the providers shared
	// with the agent's other components; sessions of its own over
	// Credentials when nil.
	Sessions *remote.Sessions
	// Views translates endpoint addresses into each provider's terms.
	Views   offload.Views
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// Workers is how many objects are reconciled at once
	// (DefaultReflectWorkers when zero).
	Workers int
	// Peers, when set, is where Peers are read and watched, shared with
	// the agent's other components (PeerCache); a cache of its own when
	// nil.
	Peers offload.PeerCache
	// RecheckRights is how often the agent asks again whether it may
	// still read the ConfigMaps and Secrets of a namespace it watches
	// (DefaultRecheckRights when zero): an open watch goes on after its
	// RoleBinding is removed.
	RecheckRights time.Duration
}

// DefaultRecheckRights is ReflectorConfig.RecheckRights' default.
const DefaultRecheckRights = time.Minute

// Reflector copies what offloaded pods need into the namespaces mirrored
// for this cluster on its providers (docs/services.md, "Reflection"):
// the ConfigMaps and Secrets the pods bound to a provider's virtual node
// reference (or that opt in with AnnotationReflect), and the Services of
// offloaded namespaces with their EndpointSlices, addresses translated.
// Like the podsync.Reflector it is level-triggered between two API servers:
// a reconcile reads the local object and its reflection from informers
// on both sides, so a restart converges without duplicating anything.
type Reflector struct {
	cfg   ReflectorConfig
	log   *slog.Logger
	local cache.Cache // everything read here but ConfigMaps and Secrets
	// objects are the ConfigMaps and Secrets of offloaded namespaces.
	objects *offloadedObjects
	pods    toolscache.Indexer // the pods of local, by podRefsIndex
	write   client.Client      // the Reflected condition
	ctrl    *ctrl.Controller[reflectKey]
	queue   ctrl.Queue[reflectKey]
	m       *reflectMetrics

	// providers watch what was reflected in the namespaces mirrored on
	// each provider.
	providers *remote.NamespaceWatches[*reflectProvider]

	stateMu sync.Mutex
	// foreign are the objects found in the way, per provider and local
	// namespace: "Kind/name" -> true.
	foreign map[nsOnProvider]map[string]bool
	since   map[reflectKey]time.Time // first change not yet acted on
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
	s := offload.MirrorScheme()
	if err := errors.Join(corev1.AddToScheme(s), discoveryv1.AddToScheme(s)); err != nil {
		panic(err)
	}
	return s
}

func reflectMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	m.Add(v1alpha1.GroupVersion.WithKind("NamespaceOffload"), meta.RESTScopeNamespace)
	// The lists too: a cache of several namespaces asks the mapper
	// whether a list's kind is namespaced.
	for _, k := range []string{"Pod", kindConfigMap, kindSecret, kindService} {
		m.Add(corev1.SchemeGroupVersion.WithKind(k), meta.RESTScopeNamespace)
		m.Add(corev1.SchemeGroupVersion.WithKind(k+"List"), meta.RESTScopeNamespace)
	}
	m.Add(discoveryv1.SchemeGroupVersion.WithKind(kindEndpointSlice), meta.RESTScopeNamespace)
	m.Add(discoveryv1.SchemeGroupVersion.WithKind(kindEndpointSlice+"List"), meta.RESTScopeNamespace)
	return m
}

// podRefsIndex indexes the pods bound to virtual nodes by what they
// reference there (indexPodRefs).
const podRefsIndex = "flotilla.reflect.refs"

func podRefKey(provider, kind, name string) string { return provider + "/" + kind + "/" + name }

// podRefsIndexer adds podRefsIndex to the informer of pods in c and
// returns the informer's store, which the reflection reads by it.
func podRefsIndexer(c cache.Cache) (toolscache.Indexer, error) {
	inf, err := c.GetInformer(context.Background(), &corev1.Pod{})
	if err != nil {
		return nil, err
	}
	if err := inf.AddIndexers(toolscache.Indexers{podRefsIndex: indexPodRefs}); err != nil {
		return nil, err
	}
	withStore, ok := inf.(interface{ GetIndexer() toolscache.Indexer })
	if !ok {
		return nil, fmt.Errorf("the informer of pods (%T) has no store to read", inf)
	}
	return withStore.GetIndexer(), nil
}

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
	if cfg.RecheckRights <= 0 {
		cfg.RecheckRights = DefaultRecheckRights
	}
	if cfg.Sessions == nil {
		cfg.Sessions = remote.NewSessions(cfg.Credentials)
	}
	local, err := cache.New(cfg.Config, cache.Options{
		Scheme: reflectScheme(), Mapper: reflectMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: podForReferences}},
		// A read of a kind not watched would start a cluster-wide watch
		// of it: ConfigMaps and Secrets are read from objects, by
		// namespace, and nothing else may be started behind its back.
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, fmt.Errorf("reflection: cache: %w", err)
	}
	pods, err := podRefsIndexer(local)
	if err != nil {
		return nil, fmt.Errorf("reflection: index pods: %w", err)
	}
	write, err := client.New(cfg.Config, client.Options{Scheme: reflectScheme(), Mapper: reflectMapper()})
	if err != nil {
		return nil, fmt.Errorf("reflection: client: %w", err)
	}
	r := &Reflector{
		cfg: cfg, log: cfg.Logger.With("component", "reflection"),
		local: offload.WithShared(local, cfg.Peers, offload.SharedNamespaceOffloads, offload.SharedServices, offload.SharedEndpointSlices), write: write, pods: pods,
		foreign: map[nsOnProvider]map[string]bool{},
		since:   map[reflectKey]time.Time{},
	}
	r.ctrl, err = ctrl.New(ctrl.Config[reflectKey]{
		Name: "reflection", Workers: cfg.Workers, MaxDelay: 30 * time.Second, Reconcile: r.reconcileTimed, Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[reflectKey]{Logger: r.log, Failed: "not reflected; retrying", Recovered: "reflected again",
			Attrs: func(k reflectKey) []any {
				return []any{"object", k.kind + " " + k.namespace + "/" + k.name, "peer", k.provider}
			},
			Level: func(err error) slog.Level {
				if errors.As(err, new(offload.RetryLater)) {
					return slog.LevelDebug
				}
				return slog.LevelWarn
			}},
	})
	if err != nil {
		return nil, fmt.Errorf("reflection: %w", err)
	}
	r.queue = r.ctrl.Queue()
	if r.objects, err = newOffloadedObjects(r, cfg.Config); err != nil {
		return nil, fmt.Errorf("reflection: %w", err)
	}
	r.providers = remote.NewNamespaceWatches(cfg.Self, cfg.Sessions, r.local, r.log, "objects", r.newProvider,
		func(pp *reflectProvider, ns string) { r.queueNamespace(pp.id, ns) })
	if r.m, err = newReflectMetrics(cfg.Metrics, r); err != nil {
		return nil, fmt.Errorf("reflection: metrics: %w", err)
	}
	return r, nil
}

// referencingPod is what the reflection's cache keeps of a pod: where it
// runs and what it references (podRefs), in a type of its own a quarter
// the size of a Pod (320 bytes against 1152), since a cluster's pods are
// held once more here. Nothing lists it through the cache's reader: the
// reflection reads the informer's index (podRefsIndex).
type referencingPod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	node string
	refs []objectRef
}

func (p *referencingPod) DeepCopyObject() runtime.Object {
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.refs = slices.Clone(p.refs)
	return &c
}

// podForReferences keeps of a pod a referencingPod: the decoded pod,
// with its containers, volumes and labels, would stay whole behind
// anything kept of it.
func podForReferences(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	kept := &referencingPod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
		},
		node: p.Spec.NodeName,
	}
	// A pod bound to one of this cluster's own nodes stays there: what
	// it references is never reflected for it.
	if p.Spec.NodeName == "" || providerOfNode(p.Spec.NodeName) != "" {
		kept.refs = podRefs(p)
	}
	return kept, nil
}

// indexPodRefs indexes a pod bound to a virtual node by what it
// references there: "<provider>/<kind>/<namespace>/<name>".
func indexPodRefs(obj any) ([]string, error) {
	p, ok := obj.(*referencingPod)
	if !ok {
		return nil, nil
	}
	provider := providerOfNode(p.node)
	if provider == "" {
		return nil, nil
	}
	out := make([]string, 0, len(p.refs))
	for _, ref := range p.refs {
		out = append(out, podRefKey(provider, ref.kind, p.Namespace+"/"+ref.name))
	}
	return out, nil
}

// Run reflects until ctx ends; it returns once every goroutine it
// started (the providers' informers too) has.
func (r *Reflector) Run(ctx context.Context) error {
	// A reference not read yet would make its object look unreferenced,
	// and its reflection be deleted.
	return r.ctrl.RunWithCache(ctx, ctrl.Start{
		What: "reflection", Cache: r.local,
		Watches: []ctrl.Watch{
			ctrl.On(&v1alpha1.NamespaceOffload{}, ctrl.OnEvery(func(obj any) {
				if o, ok := obj.(*v1alpha1.NamespaceOffload); ok {
					r.objects.offloadChanged(o.Namespace)
					r.providers.OffloadChanged(o.Namespace)
				}
			})),
			ctrl.On(&v1alpha1.Peer{}, ctrl.OnEvery(func(any) { r.providers.Trigger() })),
			ctrl.On(&corev1.Pod{}, toolscache.ResourceEventHandlerFuncs{
				AddFunc: func(obj any) { r.podChanged(obj) },
				// What a pod references cannot change; where it runs changes
				// once, when it is bound. Its status, written all the time,
				// changes nothing here.
				UpdateFunc: func(old, obj any) {
					o, ok1 := old.(*referencingPod)
					n, ok2 := obj.(*referencingPod)
					if ok1 && ok2 && o.node != n.node {
						r.podChanged(old)
						r.podChanged(obj)
					}
				},
				DeleteFunc: func(obj any) { r.podChanged(obj) },
			}),
			ctrl.On(&corev1.Service{}, ctrl.OnEvery(func(obj any) {
				r.localChanged(kindService, obj)
				r.serviceSlicesChanged(obj)
			})),
			ctrl.On(&discoveryv1.EndpointSlice{}, ctrl.OnEvery(func(obj any) { r.localChanged(kindEndpointSlice, obj) })),
		},
		Synced: func(ctx context.Context, wg *sync.WaitGroup) error {
			r.providers.Trigger()
			wg.Go(func() { r.providers.Loop(ctx) })
			wg.Go(func() { _ = r.objects.run(ctx) })
			return nil
		},
		Stopped: r.providers.StopAll,
	})
}

// podChanged queues what a pod bound to a virtual node references.
func (r *Reflector) podChanged(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*referencingPod)
	if !ok {
		return
	}
	provider := providerOfNode(p.node)
	if provider == "" {
		return
	}
	for _, ref := range p.refs {
		r.changed(reflectKey{provider: provider, kind: ref.kind, namespace: p.Namespace, name: ref.name})
	}
}

// localChanged queues a local object for every provider.
func (r *Reflector) localChanged(kind string, obj any) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	for id := range r.providers.Snapshot() {
		r.changed(reflectKey{provider: id, kind: kind, namespace: o.GetNamespace(), name: o.GetName()})
	}
}

// serviceSlicesChanged queues the EndpointSlices of a Service that
// changed: a slice is reflected only while its Service is.
func (r *Reflector) serviceSlicesChanged(obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	var slices discoveryv1.EndpointSliceList
	if err := r.local.List(context.Background(), &slices, client.InNamespace(svc.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return
	}
	for i := range slices.Items {
		r.localChanged(kindEndpointSlice, &slices.Items[i])
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

// reconcileTimed reconciles key and records the lag from the first
// change it acts on to its write.
func (r *Reflector) reconcileTimed(ctx context.Context, key reflectKey) (time.Duration, error) {
	r.stateMu.Lock()
	t, timed := r.since[key]
	delete(r.since, key)
	r.stateMu.Unlock()
	wrote, err := r.reconcileWithThird(ctx, key)
	if ctx.Err() != nil {
		return 0, err
	}
	// Not listed there yet: the watch queues the object once it is, and
	// the time it took counts in the lag.
	listing := errors.Is(err, offload.ErrNotListed)
	if listing {
		err = nil
	}
	switch {
	case wrote && timed:
		r.m.lag.WithLabelValues(key.kind, key.provider).Observe(time.Since(t).Seconds())
	case (err != nil || listing) && timed:
		r.stateMu.Lock()
		if later, ok := r.since[key]; !ok || t.Before(later) {
			r.since[key] = t
		}
		r.stateMu.Unlock()
	}
	return 0, err
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
		var err error
		if l.kind == kindConfigMap || l.kind == kindSecret {
			err = r.objects.List(ctx, l.list, ns)
		} else {
			err = r.local.List(ctx, l.list, client.InNamespace(ns))
		}
		if err != nil {
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

// queueStatus queues the Reflected condition of namespace ns on every
// provider.
func (r *Reflector) queueStatus(ns string) {
	for id := range r.providers.Snapshot() {
		r.queue.Add(reflectKey{provider: id, kind: kindStatus, namespace: ns})
	}
}

// otherProviders are the providers, other than provider, that local
// namespace ns is reflected to now, sorted: the peers whose offloaded
// pods reach its Services' endpoints on provider. A provider served by
// provider's own API server is the same cluster under another identity
// (back with a new one, its old one not retired yet): not another
// cluster, and left out, or the two identities' reflectors would each
// write a slice naming the other, and undo each other's writes.
func (r *Reflector) otherProviders(ns, provider string) []string {
	var out []string
	providers := r.providers.Snapshot()
	self := providers[provider]
	for id, pp := range providers {
		if id == provider || pp.remoteNamespace(ns) == "" || self != nil && pp.session.Server() == self.session.Server() {
			continue
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// queueSlicesElsewhere queues the EndpointSlices of local namespace ns
// for every provider but provider, when ns started or stopped being
// reflected to provider: their AnnotationReachableFrom names it.
func (r *Reflector) queueSlicesElsewhere(ns, provider string) {
	var list discoveryv1.EndpointSliceList
	if err := r.local.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return
	}
	for _, other := range r.otherProviders(ns, provider) {
		for _, s := range list.Items {
			r.queue.Add(reflectKey{provider: other, kind: kindEndpointSlice, namespace: ns, name: s.Name})
		}
	}
}

// provider is the watch of what was reflected to provider, nil when
// there is none.
func (r *Reflector) provider(id string) *reflectProvider {
	pp, _ := r.providers.Get(id)
	return pp
}
