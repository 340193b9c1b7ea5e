package podsync

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// podProvider is what a Reflector keeps for one provider: an informer
// of the local pods bound to its virtual node, one of the pods in each
// namespace mirrored there for this cluster (it may list pods only in
// namespaces it has rights in), over the session with it.
type podProvider struct {
	id, node string
	r        *Reflector
	log      *slog.Logger
	recorder record.EventRecorder
	// The session the watches were started over: a new token keeps it,
	// a new server, CA or tenant does not.
	session *remote.Session

	client typedcorev1.CoreV1Interface // writes, with the credential's timeout
	watch  typedcorev1.CoreV1Interface // informers, without

	localPods   toolscache.SharedIndexInformer
	localSynced atomic.Bool

	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup

	answering remote.Answering // whether its API server answers the watches

	mu         sync.Mutex
	namespaces map[string]*remoteNamespace // by name on the provider
}

// remoteNamespace is the watch of this cluster's pods in one namespace
// mirrored on the provider.
type remoteNamespace struct {
	name, local string
	informer    toolscache.SharedIndexInformer
	synced      atomic.Bool
	cancel      context.CancelFunc
	done        sync.WaitGroup
}

func (r *Reflector) startProvider(id string, s *remote.Session) (*podProvider, error) {
	ctx, cancel := context.WithCancel(context.Background())
	pp := &podProvider{
		id: id, node: offload.VirtualNodeName(id), r: r,
		log:      r.log.With("peer", id, "server", s.Server()),
		recorder: r.recorder(id),
		session:  s, client: s.CoreV1(), watch: s.WatchCoreV1(),
		ctx: ctx, cancel: cancel,
		namespaces: map[string]*remoteNamespace{},
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", pp.node).String()
	pods := r.watch.Pods(metav1.NamespaceAll)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return pods.Watch(ctx, opts)
		},
	}
	pp.localPods = toolscache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, toolscache.SharedIndexInformerOptions{
		Indexers: toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc},
	})
	if err := pp.localPods.SetTransform(localPodTransform); err != nil {
		cancel()
		return nil, err
	}
	queueLocal := func(obj any, initial bool) {
		if p, ok := keptOf(obj); ok {
			r.changed(podKey{provider: id, namespace: p.Namespace, name: p.Name}, initial)
		}
	}
	reg, err := pp.localPods.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    queueLocal,
		UpdateFunc: func(_, obj any) { queueLocal(obj, false) },
		DeleteFunc: func(obj any) { queueLocal(obj, false) },
	})
	if err != nil {
		cancel()
		return nil, err
	}
	pp.done.Go(func() { pp.localPods.RunWithContext(ctx) })
	pp.done.Go(func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return
		}
		pp.localSynced.Store(true)
		pp.queueAll()
	})
	return pp, nil
}

// Session is the session the watches were started over.
func (pp *podProvider) Session() *remote.Session { return pp.session }

func (pp *podProvider) Stop() {
	pp.cancel()
	pp.done.Wait()
	pp.mu.Lock()
	rns := pp.namespaces
	pp.namespaces = map[string]*remoteNamespace{}
	pp.mu.Unlock()
	// Outside the lock: a watch being stopped may be reporting.
	for _, rn := range rns {
		rn.stop()
	}
	pp.r.queueSiblings(pp)
}

// localPod is the local pod ns/name bound to the provider's virtual node,
// nil when there is none.
func (pp *podProvider) localPod(ns, name string) *corev1.Pod {
	obj, ok, err := pp.localPods.GetIndexer().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	p, ok := obj.(*keptPod)
	if !ok {
		return nil
	}
	return p.pod()
}

// namespace is the watch of remote namespace name, nil when none.
func (pp *podProvider) namespace(name string) *remoteNamespace {
	if name == "" {
		return nil
	}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.namespaces[name]
}

// Watching is the namespaces watched: remote name -> local name.
func (pp *podProvider) Watching() map[string]string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	out := make(map[string]string, len(pp.namespaces))
	for name, rn := range pp.namespaces {
		out[name] = rn.local
	}
	return out
}

// SyncNamespaces watches exactly the namespaces of want (remote ->
// local); the pods of a namespace no longer watched are queued (they are
// no longer offloaded, or wait).
func (pp *podProvider) SyncNamespaces(want map[string]string) error {
	pp.mu.Lock()
	var stopped []*remoteNamespace
	for name, rn := range pp.namespaces {
		if want[name] != rn.local {
			stopped = append(stopped, rn)
			delete(pp.namespaces, name)
		}
	}
	for name, local := range want {
		if pp.namespaces[name] == nil {
			pp.namespaces[name] = pp.startNamespace(name, local)
			pp.log.Debug("watching offloaded pods", "namespace", local, "remote", name)
		}
	}
	pp.mu.Unlock()
	for _, rn := range stopped {
		rn.stop()
		pp.log.Debug("no longer watching offloaded pods", "namespace", rn.local, "remote", rn.name)
		pp.queueNamespace(rn.local)
	}
	return nil
}

// startNamespace watches this cluster's pods in namespace name on the
// provider, mirrored for local.
func (pp *podProvider) startNamespace(name, local string) *remoteNamespace {
	ctx, cancel := context.WithCancel(pp.ctx)
	rn := &remoteNamespace{name: name, local: local, cancel: cancel}
	// Every pod there: the namespace is mirrored for this cluster alone,
	// and the origin annotation names the local pod.
	pods := pp.watch.Pods(name)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list, err := pods.List(ctx, opts)
			pp.report(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := pods.Watch(ctx, opts)
			pp.report(err)
			return w, err
		},
	}
	rn.informer = toolscache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, toolscache.SharedIndexInformerOptions{})
	// Neither can fail before the informer runs.
	_ = rn.informer.SetTransform(remoteTransform)
	_ = rn.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) {
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			pp.report(err)
		}
	})
	queueRemote := func(obj any, initial bool) {
		if p, ok := keptOf(obj); ok {
			if o, ok := parseOrigin(p.origin); ok {
				pp.r.changed(podKey{provider: pp.id, namespace: o.namespace, name: o.name}, initial)
			}
		}
	}
	reg, _ := rn.informer.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    queueRemote,
		UpdateFunc: func(_, obj any) { queueRemote(obj, false) },
		DeleteFunc: func(obj any) { queueRemote(obj, false) },
	})
	rn.done.Go(func() { rn.informer.RunWithContext(ctx) })
	rn.done.Go(func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return
		}
		rn.synced.Store(true)
		// Reconciles before now found it not listed yet and left their
		// pods alone.
		pp.queueNamespace(local)
		pp.queueRemote(rn)
	})
	return rn
}

func (rn *remoteNamespace) stop() {
	rn.cancel()
	rn.done.Wait()
}

// pod is the remote pod standing for key's local pod (its origin names
// it), nil when there is none.
func (rn *remoteNamespace) pod(key podKey) *corev1.Pod {
	obj, ok, err := rn.informer.GetStore().GetByKey(rn.name + "/" + key.name)
	if err != nil || !ok {
		return nil
	}
	p, _ := obj.(*keptPod)
	if p == nil {
		return nil
	}
	if o, ok := parseOrigin(p.origin); !ok || o.namespace != key.namespace || o.name != key.name {
		return nil // a pod of that name that is not ours: never touched
	}
	return p.pod()
}

// report records whether the provider answered; a change is logged once
// and, back from failing, every pod of the provider is looked at again at
// once rather than after its backoff.
func (pp *podProvider) report(err error) {
	if err != nil && pp.ctx.Err() != nil {
		return // stopped by us
	}
	if !pp.answering.Report(err) {
		return
	}
	if err != nil {
		pp.log.Warn("a provider's API server does not answer; its offloaded pods are left as they are until it does", "err", err)
		return
	}
	pp.log.Info("a provider's API server answers again")
	pp.queueAll()
}

// queueNamespace queues the local pods of namespace ns.
func (pp *podProvider) queueNamespace(ns string) {
	objs, err := pp.localPods.GetIndexer().ByIndex(toolscache.NamespaceIndex, ns)
	if err != nil {
		return
	}
	for _, obj := range objs {
		if p, ok := keptOf(obj); ok {
			pp.r.queue.Add(podKey{provider: pp.id, namespace: p.Namespace, name: p.Name})
		}
	}
}

// queueRemote queues the local pods rn's pods stand for (gone ones
// included: their remote pods go).
func (pp *podProvider) queueRemote(rn *remoteNamespace) {
	for _, obj := range rn.informer.GetStore().List() {
		if p, ok := keptOf(obj); ok {
			if o, ok := parseOrigin(p.origin); ok {
				pp.r.queue.Add(podKey{provider: pp.id, namespace: o.namespace, name: o.name})
			}
		}
	}
}

// queueAll queues every pod of the provider, local and remote.
func (pp *podProvider) queueAll() {
	for _, obj := range pp.localPods.GetStore().List() {
		if p, ok := keptOf(obj); ok {
			pp.r.queue.Add(podKey{provider: pp.id, namespace: p.Namespace, name: p.Name})
		}
	}
	pp.mu.Lock()
	rns := make([]*remoteNamespace, 0, len(pp.namespaces))
	for _, rn := range pp.namespaces {
		rns = append(rns, rn)
	}
	pp.mu.Unlock()
	for _, rn := range rns {
		pp.queueRemote(rn)
	}
}

// keptOf is the keptPod an informer of the pod offloading handed over,
// a deleted one's last state included.
func keptOf(obj any) (*keptPod, bool) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*keptPod)
	return p, ok
}

// keptPod is what the pod offloading's caches keep of a pod, local or
// remote (localPodTransform, remoteTransform), in a type of its own: 600
// bytes against a Pod's 1144, and every offloaded pod is held twice.
// Of a remote pod's labels and annotations only two are read, its
// AnnotationOrigin and LabelProvider: held as strings, not in two maps
// of their own (600 bytes a pod).
type keptPod struct {
	metav1.ObjectMeta
	node             string
	status           corev1.PodStatus
	origin, provider string
}

// pod is a Pod with what k keeps; it shares k's slices with the cache,
// which nothing changes.
func (k *keptPod) pod() *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: k.ObjectMeta, Spec: corev1.PodSpec{NodeName: k.node}, Status: k.status}
	if k.origin != "" {
		p.Annotations = map[string]string{offload.AnnotationOrigin: k.origin}
	}
	if k.provider != "" {
		p.Labels = map[string]string{offload.LabelProvider: k.provider}
	}
	return p
}

// localPodTransform keeps of a local pod what the reconcile reads from
// the cache: its identity, deletion and status, not its spec, labels or
// annotations (at 1000 pods, 3.5 MB of specs and most of 2.7 MB of
// metadata). The whole pod is
// read from the API server when the remote pod is made, once a pod
// (create), and a status write replaces the status alone (writeStatus).
func localPodTransform(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &keptPod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp, DeletionGracePeriodSeconds: p.DeletionGracePeriodSeconds,
		},
		node: p.Spec.NodeName, status: keptStatus(p.Status),
	}, nil
}

// keptStatus is st with its conditions in a slice of their length: the
// decoder grows it by doubling, so a pod's five conditions sit in room
// for eight (1 KiB where 640 bytes do), twice for every offloaded pod.
func keptStatus(st corev1.PodStatus) corev1.PodStatus {
	st.Conditions = slices.Clone(st.Conditions)
	return st
}

// remoteTransform keeps of a remote pod what the reconcile reads: its
// identity, deletion, origin, the provider it was made for (LabelProvider)
// and status. The spec is the consumer's (it made it), and so are its
// other labels and annotations: a thousand pods are not held twice.
func remoteTransform(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &keptPod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		status: keptStatus(p.Status),
		origin: p.Annotations[offload.AnnotationOrigin], provider: p.Labels[offload.LabelProvider],
	}, nil
}
