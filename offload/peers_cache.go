package offload

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// PeerCache is an informer's cache of the Peers that a component reads
// instead of watching them itself. Every component here watches Peers;
// each with a cache of its own held a copy of every Peer, six in an
// agent (docs/offload.md, "The agent's memory"). The agent hands them the
// Peer writer's, started and synced before they run.
type PeerCache interface {
	client.Reader
	GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error)
}

// WithPeers is own with its Peers read from peers (own alone when peers
// is nil). own never starts an informer of Peers: every read and watch of
// them goes to peers, which its owner starts.
func WithPeers(own cache.Cache, peers PeerCache) cache.Cache {
	return WithShared(own, peers)
}

// WithShared is WithPeers, and when peers is a *SharedCache, own with
// the kinds named read from it too: own never starts an informer of
// those. A component names the kinds it reads whole and unfiltered; one
// that watches a kind through a selector or a transform of its own keeps
// its own informer of it.
func WithShared(own cache.Cache, peers PeerCache, kinds ...SharedKind) cache.Cache {
	if s, ok := peers.(*SharedCache); peers == nil || ok && s == nil {
		return own
	}
	c := &sharedPeers{Cache: own, peers: peers, life: newLifetime()}
	if shared, ok := peers.(*SharedCache); ok && len(kinds) > 0 {
		c.shared = shared
		for _, k := range kinds {
			c.kinds |= 1 << k
		}
	}
	return c
}

type sharedPeers struct {
	cache.Cache
	peers PeerCache
	// shared serves the kinds of the set kinds (1 << SharedKind).
	shared *SharedCache
	kinds  uint
	// life ends with the context given to Start: reads give up then.
	life *lifetime
}

// Start runs own's informers until ctx ends; a read still waiting for
// one of them (or for a shared one) gives up then.
func (c *sharedPeers) Start(ctx context.Context) error {
	c.life.started(ctx)
	return c.Cache.Start(ctx)
}

// reader is where obj's kind is read from: peers, shared or own.
func (c *sharedPeers) reader(obj any) PeerCache {
	if isPeers(obj) {
		return c.peers
	}
	// Bit 0 is never set: an object of no shared kind stays own's.
	if c.shared != nil && c.kinds&(1<<sharedKindOf(obj)) != 0 {
		return c.shared
	}
	return nil
}

var peerKind = v1alpha1.GroupVersion.WithKind("Peer")

func isPeers(obj any) bool {
	switch obj.(type) {
	case *v1alpha1.Peer, *v1alpha1.PeerList:
		return true
	}
	return false
}

func (c *sharedPeers) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	ctx, release := c.life.bound(ctx)
	defer release()
	if r := c.reader(obj); r != nil {
		return r.Get(ctx, key, obj, opts...)
	}
	return c.Cache.Get(ctx, key, obj, opts...)
}

func (c *sharedPeers) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	ctx, release := c.life.bound(ctx)
	defer release()
	if r := c.reader(list); r != nil {
		return r.List(ctx, list, opts...)
	}
	return c.Cache.List(ctx, list, opts...)
}

func (c *sharedPeers) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if r := c.reader(obj); r != nil {
		return r.GetInformer(ctx, obj, opts...)
	}
	return c.Cache.GetInformer(ctx, obj, opts...)
}

func (c *sharedPeers) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if gvk == peerKind {
		return c.peers.GetInformer(ctx, &v1alpha1.Peer{}, opts...)
	}
	if k := sharedKindFor(gvk); c.shared != nil && k != 0 && c.kinds&(1<<k) != 0 {
		return c.shared.local.GetInformerForKind(ctx, gvk, opts...)
	}
	return c.Cache.GetInformerForKind(ctx, gvk, opts...)
}

// WaitForCacheSync waits for the shared informers too: a component that
// waits for its cache before it reads must find the kinds it reads from
// the shared one listed (the agent starts that one beside the
// components, in no given order).
func (c *sharedPeers) WaitForCacheSync(ctx context.Context) bool {
	if !c.Cache.WaitForCacheSync(ctx) {
		return false
	}
	return c.shared == nil || c.shared.WaitForCacheSync(ctx)
}

// RemoveInformer leaves the shared informers running: they are not this
// component's to stop.
func (c *sharedPeers) RemoveInformer(ctx context.Context, obj client.Object) error {
	if c.reader(obj) != nil {
		return nil
	}
	return c.Cache.RemoveInformer(ctx, obj)
}
