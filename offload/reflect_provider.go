package offload

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// reflectProvider is what a Reflector keeps for one provider: a client
// with its credential, and a cache of what this cluster reflected in the
// namespaces mirrored there (LabelReflected only: a consumer may list
// only in namespaces it has rights in, and foreign objects are looked up
// when they stand in the way).
type reflectProvider struct {
	id     string
	r      *Reflector
	client client.Client
	watch  *rest.Config // the client's config, without a timeout
	// What the client was made against: a new token alone does not make
	// a new one (currentToken), a new server, CA or tenant does.
	server, tenant string
	ca             []byte

	mu         sync.Mutex
	namespaces map[string]string // remote -> local
	remote     *remoteCache
}

// remoteCache watches the reflected objects in a set of namespaces; a
// new set is a new cache (controller-runtime's caches are made for a
// fixed set).
type remoteCache struct {
	cache.Cache
	synced atomic.Bool
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func (r *Reflector) newProvider(id string, c providerCredential) (*reflectProvider, error) {
	cfg := providerConfig(id, r.cfg.Credentials, c.config)
	cl, err := client.New(cfg, client.Options{Scheme: reflectScheme(), Mapper: reflectMapper()})
	if err != nil {
		return nil, fmt.Errorf("client for %s at %s: %w", id, c.grant.Server, err)
	}
	watch := rest.CopyConfig(cfg)
	watch.Timeout = 0 // or the watches are cut
	return &reflectProvider{
		id: id, r: r, client: cl, watch: watch,
		server: c.grant.Server, tenant: c.grant.Namespace, ca: c.config.CAData,
		namespaces: map[string]string{},
	}, nil
}

func (pp *reflectProvider) sameEndpoint(c providerCredential) bool {
	return c.grant.Server == pp.server && c.grant.Namespace == pp.tenant && bytes.Equal(c.config.CAData, pp.ca)
}

func (pp *reflectProvider) watching() map[string]string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return maps.Clone(pp.namespaces)
}

// remoteNamespace is local namespace ns's name there while it is
// watched; "" when not.
func (pp *reflectProvider) remoteNamespace(ns string) string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for remote, local := range pp.namespaces {
		if local == ns {
			return remote
		}
	}
	return ""
}

// cache is the remote cache once it has listed; nil before.
func (pp *reflectProvider) cache() *remoteCache {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.remote == nil || !pp.remote.synced.Load() {
		return nil
	}
	return pp.remote
}

// syncNamespaces watches exactly the namespaces of want (remote ->
// local). A namespace no longer watched keeps what was reflected in it:
// it is no longer mirrored for this cluster, or not ready, and goes with
// the namespace (docs/services.md).
func (pp *reflectProvider) syncNamespaces(want map[string]string) error {
	pp.mu.Lock()
	if maps.Equal(want, pp.namespaces) {
		pp.mu.Unlock()
		return nil
	}
	old := pp.remote
	pp.remote, pp.namespaces = nil, want
	pp.mu.Unlock()
	if old != nil {
		old.stop()
	}
	if len(want) == 0 {
		return nil // a cache of no namespace would watch them all
	}
	rc, start, err := pp.newCache(want)
	if err != nil {
		return fmt.Errorf("watch reflected objects on %s: %w", pp.id, err)
	}
	pp.mu.Lock()
	current := maps.Equal(want, pp.namespaces) && pp.remote == nil
	if current {
		pp.remote = rc
	}
	pp.mu.Unlock()
	if !current {
		rc.cancel() // overtaken by another set
		return nil
	}
	start()
	return nil
}

// newCache prepares the cache of namespaces; start runs it.
func (pp *reflectProvider) newCache(namespaces map[string]string) (rc *remoteCache, start func(), err error) {
	byNS := map[string]cache.Config{}
	for remote := range namespaces {
		byNS[remote] = cache.Config{}
	}
	c, err := cache.New(pp.watch, cache.Options{
		Scheme: reflectScheme(), Mapper: reflectMapper(),
		DefaultNamespaces:    byNS,
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{LabelReflected: "true"}),
		DefaultTransform:     cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rc = &remoteCache{Cache: c, cancel: cancel}
	var regs []toolscache.ResourceEventHandlerRegistration
	for kind, obj := range map[string]client.Object{
		kindConfigMap: &corev1.ConfigMap{}, kindSecret: &corev1.Secret{},
		kindService: &corev1.Service{}, kindEndpointSlice: &discoveryv1.EndpointSlice{},
	} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		reg, err := inf.AddEventHandler(onEvery(func(obj any) {
			if o, ok := obj.(client.Object); ok {
				if ns, name, ok := reflectedOrigin(o); ok {
					// Not timed: mostly the echo of our own write.
					pp.r.queue.Add(reflectKey{provider: pp.id, kind: kind, namespace: ns, name: name})
				}
			}
		}))
		if err != nil {
			cancel()
			return nil, nil, err
		}
		regs = append(regs, reg)
	}
	return rc, func() { rc.run(ctx, pp, regs, namespaces) }, nil
}

func (rc *remoteCache) run(ctx context.Context, pp *reflectProvider, regs []toolscache.ResourceEventHandlerRegistration, namespaces map[string]string) {
	rc.done.Go(func() {
		if err := rc.Start(ctx); err != nil && ctx.Err() == nil {
			pp.r.log.Warn("watch of reflected objects stopped", "peer", pp.id, "err", err)
		}
	})
	rc.done.Go(func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), func() bool {
			for _, reg := range regs {
				if !reg.HasSynced() {
					return false
				}
			}
			return true
		}) {
			return
		}
		rc.synced.Store(true)
		// Reconciles before now found nothing to compare with and left
		// their objects alone.
		for _, local := range namespaces {
			pp.r.queueNamespace(pp.id, local)
		}
	})
}

func (rc *remoteCache) stop() {
	rc.cancel()
	rc.done.Wait()
}

func (pp *reflectProvider) stop() {
	pp.mu.Lock()
	rc := pp.remote
	pp.remote, pp.namespaces = nil, map[string]string{}
	pp.mu.Unlock()
	if rc != nil {
		rc.stop()
	}
}
