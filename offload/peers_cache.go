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
	if peers == nil {
		return own
	}
	return &sharedPeers{Cache: own, peers: peers}
}

type sharedPeers struct {
	cache.Cache
	peers PeerCache
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
	if isPeers(obj) {
		return c.peers.Get(ctx, key, obj, opts...)
	}
	return c.Cache.Get(ctx, key, obj, opts...)
}

func (c *sharedPeers) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if isPeers(list) {
		return c.peers.List(ctx, list, opts...)
	}
	return c.Cache.List(ctx, list, opts...)
}

func (c *sharedPeers) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if isPeers(obj) {
		return c.peers.GetInformer(ctx, obj, opts...)
	}
	return c.Cache.GetInformer(ctx, obj, opts...)
}

func (c *sharedPeers) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if gvk == peerKind {
		return c.peers.GetInformer(ctx, &v1alpha1.Peer{}, opts...)
	}
	return c.Cache.GetInformerForKind(ctx, gvk, opts...)
}

// RemoveInformer leaves the shared informer of Peers running: it is not
// this component's to stop.
func (c *sharedPeers) RemoveInformer(ctx context.Context, obj client.Object) error {
	if isPeers(obj) {
		return nil
	}
	return c.Cache.RemoveInformer(ctx, obj)
}
