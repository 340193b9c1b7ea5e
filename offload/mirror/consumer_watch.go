package mirror

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// providerWatches keeps one informer per provider on this cluster's
// NamespaceRequests in its tenant namespace there, over the session with
// it: the providers' answers arrive as events, not by polling.
type providerWatches struct {
	log *slog.Logger
	// changed is told which local namespaces to look at again (all: every
	// offloaded one).
	changed func(namespaces []string, all bool)

	mu         sync.Mutex
	byProvider map[string]*providerWatch
}

func newProviderWatches(log *slog.Logger, changed func([]string, bool)) *providerWatches {
	return &providerWatches{log: log, changed: changed, byProvider: map[string]*providerWatch{}}
}

// indexSource indexes requests by the local namespace they mirror.
const indexSource = "source"

// providerWatch is the watch on one provider.
type providerWatch struct {
	provider  string
	session   *remote.Session
	namespace string // the tenant namespace
	server    string
	// client writes requests (with a timeout; the informer's has none,
	// or its watches would be cut).
	client   client.Client
	informer toolscache.SharedIndexInformer
	ctx      context.Context
	cancel   context.CancelFunc
	done     sync.WaitGroup
	changed  func([]string, bool)
	log      *slog.Logger

	mu        sync.Mutex
	synced    bool
	answering remote.Answering // whether its API server answers the watch
}

// sync brings the watches in line with the sessions: new ones start,
// one whose session changed (its credential reaches another endpoint)
// restarts, one whose credential is gone stops. A renewed token keeps
// the session and the watch: each request carries the token held then.
func (ws *providerWatches) sync(want map[string]*remote.Session) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var errs []error
	for id, w := range ws.byProvider {
		s, ok := want[id]
		if ok && s == w.session {
			continue
		}
		w.stop()
		delete(ws.byProvider, id)
		ws.log.Info("stopped watching a provider's namespace requests", "peer", id, "credential", ok)
		ws.changed(nil, true)
	}
	for id, s := range want {
		if ws.byProvider[id] != nil {
			continue
		}
		w, err := startProviderWatch(s, ws.log, ws.changed)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ws.byProvider[id] = w
		ws.log.Info("watching a provider's namespace requests", "peer", id, "namespace", s.TenantNamespace(), "server", s.Server())
	}
	return errors.Join(errs...)
}

// get is the watch of provider, nil when there is none.
func (ws *providerWatches) get(provider string) *providerWatch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.byProvider[provider]
}

// all is every watch, by provider.
func (ws *providerWatches) all() map[string]*providerWatch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make(map[string]*providerWatch, len(ws.byProvider))
	for id, w := range ws.byProvider {
		out[id] = w
	}
	return out
}

func (ws *providerWatches) stopAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for id, w := range ws.byProvider {
		w.stop()
		delete(ws.byProvider, id)
	}
}

func startProviderWatch(s *remote.Session, log *slog.Logger, changed func([]string, bool)) (*providerWatch, error) {
	reads := s.WatchClient()
	ctx, cancel := context.WithCancel(context.Background())
	w := &providerWatch{
		provider: s.Provider(), session: s, namespace: s.TenantNamespace(), server: s.Server(),
		client: s.Client(), ctx: ctx, cancel: cancel, changed: changed,
		log: log.With("peer", s.Provider(), "server", s.Server()),
	}
	ns := s.TenantNamespace()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var list v1alpha1.NamespaceRequestList
			err := reads.List(ctx, &list, client.InNamespace(ns), &client.ListOptions{Raw: &opts})
			w.report(err)
			return &list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			wi, err := reads.Watch(ctx, &v1alpha1.NamespaceRequestList{}, client.InNamespace(ns), &client.ListOptions{Raw: &opts})
			w.report(err)
			return wi, err
		},
	}
	w.informer = toolscache.NewSharedIndexInformerWithOptions(lw, &v1alpha1.NamespaceRequest{}, toolscache.SharedIndexInformerOptions{
		Indexers: toolscache.Indexers{indexSource: func(obj any) ([]string, error) {
			if r, ok := obj.(*v1alpha1.NamespaceRequest); ok && r.Labels[v1alpha1.LabelMirroredFrom] != "" {
				return []string{r.Labels[v1alpha1.LabelMirroredFrom]}, nil
			}
			return nil, nil
		}},
	})
	if err := w.informer.SetTransform(func(obj any) (any, error) {
		if o, ok := obj.(metav1.Object); ok {
			o.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		cancel()
		return nil, err
	}
	// Failures are recorded by the list and watch above and shown in
	// status; the reflector's own log line would repeat every retry.
	if err := w.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) {
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			w.report(err)
		}
	}); err != nil {
		cancel()
		return nil, err
	}
	if _, err := w.informer.AddEventHandler(w.requestEvents()); err != nil {
		cancel()
		return nil, err
	}
	w.done.Go(func() { w.informer.RunWithContext(ctx) })
	w.done.Go(func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
			return
		}
		w.mu.Lock()
		w.synced = true
		w.mu.Unlock()
		// Every offloaded namespace, and every one with a request there
		// (an orphan left by a NamespaceOffload removed without us).
		changed(w.informer.GetIndexer().ListIndexFuncValues(indexSource), true)
	})
	return w, nil
}

func (w *providerWatch) stop() {
	w.cancel()
	w.done.Wait()
}

// report records whether the provider's API server answered; a change
// between answering and failing is logged and looked at by every
// namespace.
func (w *providerWatch) report(err error) {
	if err != nil && w.ctx.Err() != nil {
		return // stopped by us
	}
	if !w.answering.Report(err) {
		return
	}
	if err != nil {
		w.log.Warn("a provider's API server does not answer; its namespaces show Unreachable until it does", "err", err)
	} else {
		w.log.Info("a provider's API server answers again")
	}
	w.changed(nil, true)
}

// state is whether the watch holds the provider's requests, and the
// provider's last error.
func (w *providerWatch) state() (synced bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced, w.answering.Err()
}

// requestsOf are the requests mirroring local namespace source.
func (w *providerWatch) requestsOf(source string) []*v1alpha1.NamespaceRequest {
	objs, err := w.informer.GetIndexer().ByIndex(indexSource, source)
	if err != nil {
		return nil
	}
	out := make([]*v1alpha1.NamespaceRequest, 0, len(objs))
	for _, o := range objs {
		if r, ok := o.(*v1alpha1.NamespaceRequest); ok {
			out = append(out, r)
		}
	}
	return out
}

// request is the request named name, nil when there is none.
func (w *providerWatch) request(name string) *v1alpha1.NamespaceRequest {
	o, ok, err := w.informer.GetIndexer().GetByKey(w.namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	r, _ := o.(*v1alpha1.NamespaceRequest)
	return r
}

// requestEvents queue the local namespace a request mirrors.
func (w *providerWatch) requestEvents() toolscache.ResourceEventHandler {
	return ctrl.OnEvery(func(obj any) {
		if r, ok := obj.(*v1alpha1.NamespaceRequest); ok {
			w.changed([]string{r.Labels[v1alpha1.LabelMirroredFrom], r.Spec.SourceNamespace}, false)
		}
	})
}
