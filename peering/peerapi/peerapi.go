// Package peerapi is the Kubernetes side of peering: it reports the specs
// of Peer objects to the engine as plain peering.Spec, and writes the
// engine's plain peer states into their status, through a rate-limited
// work queue of server-side-apply patches. The negotiation in peering
// knows nothing of it.
package peerapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering"
)

// Scheme knows the flotilla.io types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Specs receives the admin's decisions (*peering.Engine does).
type Specs interface {
	SpecChanged(id string, s peering.Spec)
	SpecDeleted(id string)
}

// Objects keeps the Peer objects of the local API server: it reports their
// specs and writes their status. It is the engine's peering.Publisher.
type Objects struct {
	cache  cache.Cache
	log    *slog.Logger
	status *statusWriter
	synced chan struct{}
	// started: the cache runs, by Run or RunCache, whichever came first.
	started atomic.Bool
}

// New prepares a client and an informer for Peers; Run starts them.
func New(cfg *rest.Config, log *slog.Logger) (*Objects, error) {
	scheme := Scheme()
	mapper := peerMapper()
	c, err := client.New(writeClientConfig(cfg), client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("client for Peers: %w", err)
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme, Mapper: mapper, DefaultTransform: keepOwnApply})
	if err != nil {
		return nil, fmt.Errorf("cache for Peers: %w", err)
	}
	status, err := newStatusWriter(c, ca, log)
	if err != nil {
		return nil, err
	}
	return &Objects{cache: ca, log: log, status: status, synced: make(chan struct{})}, nil
}

// peerMapper knows where Peers are served. The client and the informer
// would otherwise each ask the API server first (two requests on the way
// to gossip, two more before the first status).
func peerMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	return m
}

// Publish queues s to be written to its Peer's status (peering.Publisher).
func (o *Objects) Publish(s peering.PeerState) { o.status.publish(s) }

// Withdraw drops what is queued for id (peering.Publisher).
func (o *Objects) Withdraw(id string) { o.status.withdraw(id) }

// Retire deletes id's Peer, which has no use left (why), unless the admin
// decided something in its spec (peering.Publisher).
func (o *Objects) Retire(id, why string) { o.status.retire(id, why) }

// Reader reads Peers from the informer's cache.
func (o *Objects) Reader() client.Reader { return o.cache }

// Shared is the informer's cache, for the agent's components that read
// and watch Peers too, rather than each keeping a copy of every Peer; Run
// starts it, its users never do.
func (o *Objects) Shared() cache.Cache { return o.cache }

// AddHandler has h told of Peer changes too; added after the informer
// started, h first hears of every Peer there is.
func (o *Objects) AddHandler(ctx context.Context, h toolscache.ResourceEventHandler) error {
	inf, err := o.cache.GetInformer(ctx, &v1alpha1.Peer{})
	if err != nil {
		return fmt.Errorf("watch Peers: %w", err)
	}
	if _, err := inf.AddEventHandler(h); err != nil {
		return fmt.Errorf("watch Peers: %w", err)
	}
	return nil
}

// Synced is closed once Run has reported every existing Peer's spec and
// starts writing statuses.
func (o *Objects) Synced() <-chan struct{} { return o.synced }

// informerSyncPoll is how often the informer is asked whether it synced.
const informerSyncPoll = 5 * time.Millisecond

// statusWorkers write statuses of different peers at once; one peer's
// writes are never concurrent (the work queue sees to it).
const statusWorkers = 4

// Run reports every Peer's spec to specs, and deletions, and writes the
// published states, until ctx ends or the informer fails. It returns when
// all its goroutines have; call it once.
func (o *Objects) Run(ctx context.Context, specs Specs) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	inf, err := o.informer(ctx)
	if err != nil {
		return err
	}
	reg, err := inf.AddEventHandler(specHandler(specs))
	if err != nil {
		return fmt.Errorf("watch Peers: %w", err)
	}
	// A cache RunCache started reports its own end; this one's is Run's.
	cacheErr := make(chan error, 1)
	if o.started.CompareAndSwap(false, true) {
		wg.Go(func() { cacheErr <- o.cache.Start(ctx) })
	}
	// The engine hears every existing spec before any status is written,
	// so the first statuses already name the specs they act on. Not the
	// cache's WaitForCacheSync: it looks every 100 ms, and discovery
	// starts only after this.
	synced := func(context.Context) (bool, error) { return reg.HasSynced(), nil }
	if wait.PollUntilContextCancel(ctx, informerSyncPoll, true, synced) != nil {
		select {
		case err := <-cacheErr:
			if err != nil {
				return fmt.Errorf("watch Peers: %w", err)
			}
		default:
		}
		return fmt.Errorf("watch Peers: the informer did not sync: %w (is the peers.flotilla.io CRD installed?)", ctx.Err())
	}
	close(o.synced)
	wg.Go(func() { _ = o.status.run(ctx) })
	select {
	case <-ctx.Done():
		return nil
	case err := <-cacheErr:
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("no error given")
		}
		return fmt.Errorf("the Peer informer stopped: %w", err)
	}
}

// RunCache runs the Peers' informer ahead of Run, until ctx ends or it
// fails: a standby replica keeps it synced while it waits for the Lease,
// so that Run, once it holds it, finds every Peer already listed (the
// handler it adds hears them all at once) and needs no request to the
// API server first. Run then leaves the cache to RunCache. HasSynced
// says when the informer has listed.
func (o *Objects) RunCache(ctx context.Context) error {
	if _, err := o.informer(ctx); err != nil {
		return err
	}
	if !o.started.CompareAndSwap(false, true) {
		return errors.New("watch Peers: the cache is already running")
	}
	if err := o.cache.Start(ctx); err != nil {
		return fmt.Errorf("the Peer informer stopped: %w", err)
	}
	return nil
}

// HasSynced says whether the Peers' informer has listed them all.
func (o *Objects) HasSynced(ctx context.Context) bool {
	inf, err := o.informer(ctx)
	return err == nil && inf.HasSynced()
}

// informer is the Peers' informer, made the first time it is asked for.
func (o *Objects) informer(ctx context.Context) (cache.Informer, error) {
	inf, err := o.cache.GetInformer(ctx, &v1alpha1.Peer{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("watch Peers: %w", err)
	}
	return inf, nil
}

// specHandler reports specs as they change. Status writes do not change a
// Peer's generation; only spec changes are reported again.
func specHandler(specs Specs) toolscache.ResourceEventHandler {
	peerOf := func(obj any) *v1alpha1.Peer {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, _ := obj.(*v1alpha1.Peer)
		return p
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p := peerOf(obj); p != nil {
				specs.SpecChanged(p.Name, specOf(p))
			}
		},
		UpdateFunc: func(old, obj any) {
			if o, p := peerOf(old), peerOf(obj); p != nil && (o == nil || o.Generation != p.Generation) {
				specs.SpecChanged(p.Name, specOf(p))
			}
		},
		DeleteFunc: func(obj any) {
			if p := peerOf(obj); p != nil {
				specs.SpecDeleted(p.Name)
			}
		},
	}
}

// specOf is what the engine needs of a Peer's spec.
func specOf(p *v1alpha1.Peer) peering.Spec {
	s := peering.Spec{Generation: p.Generation}
	switch p.Spec.Networking {
	case v1alpha1.NetworkingAccept:
		s.Networking = peering.NetworkingAccept
	case v1alpha1.NetworkingDeny:
		s.Networking = peering.NetworkingDeny
	}
	return s
}
