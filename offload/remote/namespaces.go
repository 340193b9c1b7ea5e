package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/offload"
)

// providerResync is how often the providers are brought in line without
// an event: a credential can come or go without its Peer changing (the
// grants kept from before loaded at the agent's start, an expiry).
const providerResync = 10 * time.Second

// Watcher is what a reflector keeps per provider: watches of the
// namespaces mirrored for this cluster there, over the session with it.
type Watcher interface {
	comparable
	// Session is the session the watches were started over: a new
	// session (the credential reaches another endpoint) restarts them.
	Session() *Session
	// SyncNamespaces watches want (remote name -> local name) and no
	// other namespace.
	SyncNamespaces(want map[string]string) error
	// Watching is what SyncNamespaces was last given.
	Watching() map[string]string
	// Stop ends every watch.
	Stop()
}

// NamespaceWatches keeps a Watcher for every Peer whose credential
// this cluster holds, each watching the namespaces mirrored there over
// the session with it: the part podsync.Reflector and
// reflection.Reflector share.
type NamespaceWatches[P Watcher] struct {
	self     string
	sessions *Sessions
	local    client.Reader // Peers and NamespaceOffloads
	log      *slog.Logger
	what     string // what is reflected, in logs
	// start starts watching provider id over s; queue queues what local
	// namespace ns holds for p, once its offloading changed.
	start func(id string, s *Session) (P, error)
	queue func(p P, ns string)

	// resync asks for the providers and their namespaces to be brought
	// in line with the Peers, credentials and NamespaceOffloads.
	resync chan struct{}

	mu        sync.Mutex
	providers map[string]P
	// dirty are local namespaces whose NamespaceOffloads changed: what
	// they hold is queued once the namespace watches follow.
	dirty map[string]bool
}

func NewNamespaceWatches[P Watcher](self string, sessions *Sessions, local client.Reader, log *slog.Logger, what string,
	start func(string, *Session) (P, error), queue func(P, string)) *NamespaceWatches[P] {
	return &NamespaceWatches[P]{
		self: self, sessions: sessions, local: local, log: log, what: what, start: start, queue: queue,
		resync: make(chan struct{}, 1), providers: map[string]P{}, dirty: map[string]bool{},
	}
}

// Trigger asks the loop for a pass; it never blocks.
func (w *NamespaceWatches[P]) Trigger() {
	select {
	case w.resync <- struct{}{}:
	default:
	}
}

// OffloadChanged notes that the NamespaceOffload of ns changed.
func (w *NamespaceWatches[P]) OffloadChanged(ns string) {
	w.mu.Lock()
	w.dirty[ns] = true
	w.mu.Unlock()
	w.Trigger()
}

// Loop brings the providers in line whenever asked, every
// providerResync, and again a little later when that failed.
func (w *NamespaceWatches[P]) Loop(ctx context.Context) {
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
		case <-w.resync:
		case <-resync.C:
		case <-retry.C:
		}
		err := w.sync(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if err.Error() != last {
				w.log.Warn("providers' watches of "+w.what+" not in line; retrying", "err", err)
			}
			last = err.Error()
			retry.Reset(5 * time.Second)
		case err == nil && last != "":
			w.log.Info("providers' watches of " + w.what + " in line again")
			last = ""
		}
	}
}

// sync keeps a watch for every Peer whose credential this cluster holds,
// on the namespaces mirrored there, and queues what the namespaces whose
// offloading changed hold.
func (w *NamespaceWatches[P]) sync(ctx context.Context) error {
	// Only their names are read: uncopied, the Peers of a federation of
	// 100 are not 2 MB of garbage at every change of one.
	var peers v1alpha1.PeerList
	if err := w.local.List(ctx, &peers, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list Peers: %w", err)
	}
	var offloads v1alpha1.NamespaceOffloadList
	if err := w.local.List(ctx, &offloads); err != nil {
		return fmt.Errorf("list NamespaceOffloads: %w", err)
	}
	want := map[string]*Session{}
	var errs []error
	for _, p := range peers.Items {
		if p.Name == w.self || identity.ValidateClusterID(p.Name) != nil {
			continue
		}
		s, err := w.sessions.Of(p.Name)
		switch {
		case err == nil:
			want[p.Name] = s
		case !errors.Is(err, ErrNoCredential):
			errs = append(errs, err)
		}
	}
	var stopping []P
	w.mu.Lock()
	for id, p := range w.providers {
		if s, ok := want[id]; !ok || p.Session() != s {
			stopping = append(stopping, p)
			delete(w.providers, id)
		}
	}
	w.mu.Unlock()
	for _, p := range stopping {
		p.Stop()
	}
	if len(stopping) > 0 {
		w.log.Info("stopped reflecting "+w.what+" to providers", "stopped", len(stopping))
	}
	for id, s := range want {
		if _, ok := w.Get(id); ok {
			continue
		}
		p, err := w.start(id, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		w.mu.Lock()
		w.providers[id] = p
		w.mu.Unlock()
		w.log.Info("reflecting "+w.what+" to a provider", "peer", id, "server", s.Server())
	}
	w.mu.Lock()
	dirty := w.dirty
	w.dirty = map[string]bool{}
	w.mu.Unlock()
	for id, p := range w.Snapshot() {
		if err := p.SyncNamespaces(watchedNamespaces(offloads.Items, id, p.Watching())); err != nil {
			errs = append(errs, err)
		}
		for ns := range dirty {
			w.queue(p, ns)
		}
	}
	return errors.Join(errs...)
}

// Get returns the watch of provider id.
func (w *NamespaceWatches[P]) Get(id string) (P, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.providers[id]
	return p, ok
}

// Snapshot returns the watches by provider, as they are now.
func (w *NamespaceWatches[P]) Snapshot() map[string]P {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]P, len(w.providers))
	for id, p := range w.providers {
		out[id] = p
	}
	return out
}

// StopAll stops every watch.
func (w *NamespaceWatches[P]) StopAll() {
	w.mu.Lock()
	all := w.providers
	w.providers = map[string]P{}
	w.mu.Unlock()
	for _, p := range all {
		p.Stop()
	}
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
		name, ready := offload.MirroredNamespace(o, provider)
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
