package offload

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// SharedKind is a kind of the local cluster that components read from a
// SharedCache instead of watching it themselves. Each component with a
// cache of its own had an informer of every kind it read, several per
// kind in an agent (NamespaceOffloads five times, Namespaces, Services
// and EndpointSlices three or more): about ten goroutines, a watch and a
// copy of every object each.
type SharedKind int

const (
	SharedNamespaceOffloads SharedKind = iota + 1
	SharedNamespaces
	SharedServices
	SharedEndpointSlices
	SharedServiceExports
)

// sharedKindOf is the kind obj (an object or a list, typed: a metadata
// or unstructured one is not shared) is of; 0 when none.
func sharedKindOf(obj any) SharedKind {
	switch obj.(type) {
	case *v1alpha1.NamespaceOffload, *v1alpha1.NamespaceOffloadList:
		return SharedNamespaceOffloads
	case *corev1.Namespace, *corev1.NamespaceList:
		return SharedNamespaces
	case *corev1.Service, *corev1.ServiceList:
		return SharedServices
	case *discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList:
		return SharedEndpointSlices
	case *mcsv1alpha1.ServiceExport, *mcsv1alpha1.ServiceExportList:
		return SharedServiceExports
	}
	return 0
}

// sharedKinds are where each SharedKind is served: what sharedKindFor
// and the cache's REST mapper read.
var sharedKinds = []struct {
	kind  SharedKind
	gvk   schema.GroupVersionKind
	scope meta.RESTScope
}{
	{SharedNamespaceOffloads, v1alpha1.GroupVersion.WithKind("NamespaceOffload"), meta.RESTScopeNamespace},
	{SharedNamespaces, corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot},
	{SharedServices, corev1.SchemeGroupVersion.WithKind("Service"), meta.RESTScopeNamespace},
	{SharedEndpointSlices, discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), meta.RESTScopeNamespace},
	{SharedServiceExports, mcsv1alpha1.SchemeGroupVersion.WithKind("ServiceExport"), meta.RESTScopeNamespace},
}

// sharedKindFor is the SharedKind of a kind's objects; 0 when none.
func sharedKindFor(gvk schema.GroupVersionKind) SharedKind {
	for _, k := range sharedKinds {
		if k.gvk == gvk {
			return k.kind
		}
	}
	return 0
}

// SharedCache is one informer per SharedKind of the local cluster, each
// object whole but for its managedFields (what any of its readers reads),
// and the Peer writer's cache of Peers. The agent makes one and starts it
// (Start); the components given it as their PeerCache read and watch
// through it the kinds they name to WithShared, and never start or stop
// its informers. Its objects are shared: a reader that lists them
// uncopied (client.UnsafeDisableDeepCopy) must not change them.
type SharedCache struct {
	peers PeerCache
	local cache.Cache
	life  *lifetime
}

// NewSharedCache prepares the informers (made as the components first
// ask for a kind) over cfg's API server; peers is the cache Peers are
// read from (nil: an informer of its own).
func NewSharedCache(cfg *rest.Config, peers PeerCache) (*SharedCache, error) {
	c, err := cache.New(cfg, cache.Options{
		Scheme: sharedScheme(), Mapper: sharedMapper(), DefaultTransform: cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, fmt.Errorf("shared cache: %w", err)
	}
	if peers == nil {
		peers = c
	}
	return &SharedCache{peers: peers, local: c, life: newLifetime()}, nil
}

func sharedScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, corev1.AddToScheme, discoveryv1.AddToScheme, mcsv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // the types are linked in: a mistake shows in every test
		}
	}
	return s
}

// sharedMapper knows where the shared kinds are served, so that the
// cache does not discover every API group the server has.
func sharedMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion,
		discoveryv1.SchemeGroupVersion, mcsv1alpha1.SchemeGroupVersion})
	add := func(gvk schema.GroupVersionKind, scope meta.RESTScope) {
		m.Add(gvk, scope)
		// The lists too: a cache asks whether a list's kind is namespaced.
		m.Add(gvk.GroupVersion().WithKind(gvk.Kind+"List"), scope)
	}
	add(peerKind, meta.RESTScopeRoot)
	for _, k := range sharedKinds {
		add(k.gvk, k.scope)
	}
	return m
}

// Start runs the informers until ctx ends (the agent's, once). A read
// still waiting for an informer to sync gives up then.
func (c *SharedCache) Start(ctx context.Context) error {
	c.life.started(ctx)
	return c.local.Start(ctx)
}

// WaitForCacheSync waits until the informers made so far have listed
// everything; false when ctx ended first.
func (c *SharedCache) WaitForCacheSync(ctx context.Context) bool {
	return c.local.WaitForCacheSync(ctx)
}

func (c *SharedCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	ctx, release := c.life.bound(ctx)
	defer release()
	if isPeers(obj) {
		return c.peers.Get(ctx, key, obj, opts...)
	}
	return c.local.Get(ctx, key, obj, opts...)
}

func (c *SharedCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	ctx, release := c.life.bound(ctx)
	defer release()
	if isPeers(list) {
		return c.peers.List(ctx, list, opts...)
	}
	return c.local.List(ctx, list, opts...)
}

func (c *SharedCache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if isPeers(obj) {
		return c.peers.GetInformer(ctx, obj, opts...)
	}
	return c.local.GetInformer(ctx, obj, opts...)
}
