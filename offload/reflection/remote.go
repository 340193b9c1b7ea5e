package reflection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/remote"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// reflectProvider is what a Reflector keeps for one provider: the
// session with it, and per namespace mirrored there a cache of what
// this cluster reflected in it (LabelReflected only: a consumer may list
// only in namespaces it has rights in, and foreign objects are looked up
// when they stand in the way). A cache per namespace, so that a
// namespace mirrored or dropped starts or stops its own watches and
// leaves the others' alone.
type reflectProvider struct {
	id     string
	r      *Reflector
	client client.Client
	// The session the caches were started over: a new token keeps it, a
	// new server, CA or tenant does not.
	session *remote.Session

	mu     sync.Mutex
	caches map[string]*remoteCache // by remote namespace
}

// remoteCache watches the reflected objects in one namespace mirrored
// for local.
type remoteCache struct {
	cache.Cache
	local  string
	synced atomic.Bool
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func (r *Reflector) newProvider(id string, s *remote.Session) (*reflectProvider, error) {
	return &reflectProvider{id: id, r: r, client: s.Client(), session: s, caches: map[string]*remoteCache{}}, nil
}

// Session is the session the caches were started over.
func (pp *reflectProvider) Session() *remote.Session { return pp.session }

func (pp *reflectProvider) Watching() map[string]string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	out := make(map[string]string, len(pp.caches))
	for remote, rc := range pp.caches {
		out[remote] = rc.local
	}
	return out
}

// remoteNamespace is local namespace ns's name there while it is
// watched; "" when not.
func (pp *reflectProvider) remoteNamespace(ns string) string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for remote, rc := range pp.caches {
		if rc.local == ns {
			return remote
		}
	}
	return ""
}

// cacheOf is the cache of remote namespace ns once it has listed; nil
// before.
func (pp *reflectProvider) cacheOf(ns string) *remoteCache {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if rc := pp.caches[ns]; rc != nil && rc.synced.Load() {
		return rc
	}
	return nil
}

// SyncNamespaces watches exactly the namespaces of want (remote ->
// local). A namespace no longer watched keeps what was reflected in it:
// it is no longer mirrored for this cluster, or not ready, and goes with
// the namespace (docs/services.md).
func (pp *reflectProvider) SyncNamespaces(want map[string]string) error {
	var stopped []*remoteCache
	var starting []string
	pp.mu.Lock()
	for remote, rc := range pp.caches {
		if want[remote] != rc.local {
			stopped = append(stopped, rc)
			delete(pp.caches, remote)
		}
	}
	for remote := range want {
		if pp.caches[remote] == nil {
			starting = append(starting, remote)
		}
	}
	pp.mu.Unlock()
	for _, rc := range stopped {
		rc.stop()
		pp.r.queueSlicesElsewhere(rc.local, pp.id)
	}
	var errs []error
	for _, remote := range starting {
		rc, start, err := pp.newCache(remote, want[remote])
		if err != nil {
			errs = append(errs, fmt.Errorf("watch reflected objects in %s on %s: %w", remote, pp.id, err))
			continue
		}
		pp.mu.Lock()
		taken := pp.caches[remote] != nil
		if !taken {
			pp.caches[remote] = rc
		}
		pp.mu.Unlock()
		if taken {
			rc.cancel() // started by a pass that overtook this one
			continue
		}
		start()
	}
	return errors.Join(errs...)
}

// newCache prepares the cache of remote namespace ns, mirrored for
// local; start runs it.
func (pp *reflectProvider) newCache(ns, local string) (rc *remoteCache, start func(), err error) {
	c, err := pp.session.NewCache(cache.Options{
		DefaultNamespaces:    map[string]cache.Config{ns: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{offload.LabelReflected: "true"}),
		DefaultTransform:     cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rc = &remoteCache{Cache: c, local: local, cancel: cancel}
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
		reg, err := inf.AddEventHandler(ctrl.OnEvery(func(obj any) {
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
	return rc, func() { rc.run(ctx, pp, regs) }, nil
}

func (rc *remoteCache) run(ctx context.Context, pp *reflectProvider, regs []toolscache.ResourceEventHandlerRegistration) {
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
		pp.r.queueNamespace(pp.id, rc.local)
		pp.r.queueSlicesElsewhere(rc.local, pp.id)
	})
}

func (rc *remoteCache) stop() {
	rc.cancel()
	rc.done.Wait()
}

func (pp *reflectProvider) Stop() {
	pp.mu.Lock()
	all := pp.caches
	pp.caches = map[string]*remoteCache{}
	pp.mu.Unlock()
	for _, rc := range all {
		rc.stop()
		pp.r.queueSlicesElsewhere(rc.local, pp.id)
	}
}

// counts is how many reflected objects of each kind the provider's
// caches hold.
func (pp *reflectProvider) counts() map[string]int {
	pp.mu.Lock()
	caches := slices.Collect(maps.Values(pp.caches))
	pp.mu.Unlock()
	out := map[string]int{}
	for _, rc := range caches {
		if !rc.synced.Load() {
			continue
		}
		for kind, n := range rc.counts() {
			out[kind] += n
		}
	}
	return out
}
