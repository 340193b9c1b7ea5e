package policyapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy"
)

// DefaultDebounce is the least time between two decisions: a
// change after a quiet spell is decided on at once, and the rest of a
// burst (a Deployment scaled, a namespace offloaded) gathered into one
// decision and one kernel transaction every so often. Each decision reads
// everything the informers hold, so this bounds what a burst costs.
const DefaultDebounce = 20 * time.Millisecond

// unsafeNoCopy: the feed lists everything once a pass and changes nothing
// it read, so the cache hands out its own objects.
var unsafeNoCopy = true

// trafficRetry is how soon a decision that could not be applied, or a
// status that could not be written, is tried again.
const trafficRetry = time.Second

// FeedConfig is what a Feed needs.
type FeedConfig struct {
	// Config reaches the local API server: the objects the feed follows
	// and the Peers' status it writes.
	Config *rest.Config
	// Dataplane is handed every decision.
	Dataplane *SegregatingDataplane
	// Default is --traffic.
	Default policy.Mode
	// Debounce is DefaultDebounce when zero.
	Debounce time.Duration
	// Peers, when set, is the agent's shared cache of Peers
	// (offload.PeerCache); a cache of its own when nil.
	Peers   offload.PeerCache
	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Feed follows, with informers, what Segregated peers may reach
// (pods in tenant namespaces, Services reflected and exported with their
// EndpointSlices, NamespaceOffloads, ServiceExports, Peers), decides anew
// after every burst of changes and hands the decision to the data plane;
// it writes each Peer's mode in effect into its status.
type Feed struct {
	cfg   FeedConfig
	log   *slog.Logger
	cache cache.Cache
	pods  toolscache.Indexer // the trafficPods of cache's informer of pods, once Run got it
	// namespaces is the store of the cache's informer of Namespaces, once
	// Run got it: a pod's event counts only in a tenant namespace.
	namespaces toolscache.Indexer
	write      client.Client // Peer status
	m          *trafficMetrics

	wake   chan struct{}
	synced atomic.Bool

	mu    sync.Mutex
	since time.Time // the first change not yet decided on; zero: none
	// problems are the errors of the input last logged, by object.
	problems map[string]string
}

type trafficMetrics struct {
	latency  prometheus.Histogram
	problems *prometheus.GaugeVec
	passes   prometheus.Counter
}

func newTrafficMetrics(r prometheus.Registerer) (*trafficMetrics, error) {
	m := &trafficMetrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flotilla_policy_update_latency_seconds",
			Help: "From the first change of a burst seen by the agent's informers (a pod, Service, EndpointSlice, ServiceExport, NamespaceOffload or Peer) until the kernel acknowledged the Segregated peers' sets it led to; bursts that leave the sets as they were are not counted.",
			// 1 ms to 16 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_policy_input_errors",
			Help: "Objects of which a part cannot be enforced (an IPv6 address, a port of zero or none, an unknown protocol) and is left out of the Segregated peers' sets, by kind; the agent's log names them.",
		}, []string{"kind"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_policy_passes_total",
			Help: "Decisions on the Segregated peers' sets: each reads everything the informers hold, after a burst of changes that can matter to them.",
		}),
	}
	for _, k := range []string{"Pod", "EndpointSlice"} {
		m.problems.WithLabelValues(k) // shown at 0 before the first
	}
	if r == nil {
		return m, nil
	}
	return m, errors.Join(r.Register(m.latency), r.Register(m.problems), r.Register(m.passes))
}

// Scheme and trafficMapper know every kind the feed reads and writes, so
// the cache asks the API server nothing before watching: the MCS CRDs may
// be established after the agent starts.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := errors.Join(v1alpha1.AddToScheme(s), corev1.AddToScheme(s), discoveryv1.AddToScheme(s), mcsv1alpha1.AddToScheme(s)); err != nil {
		panic(err) // the types are compiled in: a mistake shows in every test
	}
	return s
}

func trafficMapper() meta.RESTMapper {
	mcsGV := schema.GroupVersion{Group: mcsv1alpha1.GroupName, Version: "v1alpha1"}
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion, mcsGV})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	m.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	for _, gvk := range []schema.GroupVersionKind{
		v1alpha1.GroupVersion.WithKind("NamespaceOffload"), corev1.SchemeGroupVersion.WithKind("Pod"),
		corev1.SchemeGroupVersion.WithKind("Service"), discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
		mcsGV.WithKind("ServiceExport"),
	} {
		m.Add(gvk, meta.RESTScopeNamespace)
	}
	return m
}

// NewFeed makes a Feed and registers its metrics; Run starts it.
func NewFeed(cfg FeedConfig) (*Feed, error) {
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c, err := cache.New(cfg.Config, cache.Options{
		Scheme: Scheme(), Mapper: trafficMapper(),
		DefaultTransform:             cache.TransformStripManagedFields(),
		DefaultUnsafeDisableDeepCopy: &unsafeNoCopy,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:       {Transform: podForTraffic},
			&corev1.Namespace{}: {Transform: namespaceForTraffic},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("traffic policy: cache: %w", err)
	}
	w, err := client.New(cfg.Config, client.Options{Scheme: Scheme(), Mapper: trafficMapper()})
	if err != nil {
		return nil, fmt.Errorf("traffic policy: client: %w", err)
	}
	m, err := newTrafficMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("traffic policy: metrics: %w", err)
	}
	return &Feed{cfg: cfg, log: cfg.Logger.With("component", "traffic policy"), cache: offload.WithShared(c, cfg.Peers,
		offload.SharedNamespaceOffloads, offload.SharedNamespaces, offload.SharedServices, offload.SharedEndpointSlices, offload.SharedServiceExports), write: w, m: m,
		wake: make(chan struct{}, 1), problems: map[string]string{}}, nil
}

// trafficPod is what the feed keeps of a pod: what the policy reads
// (where it is, its addresses, whether they are its own, whether it
// still runs), in a type of its own a quarter the size of a Pod (320
// bytes against 1152): the feed holds every pod of the cluster. read
// turns them back into Pods for the policy.
type trafficPod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	hostNetwork bool
	phase       corev1.PodPhase
	podIPs      []corev1.PodIP
}

func (p *trafficPod) DeepCopyObject() runtime.Object {
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.podIPs = slices.Clone(p.podIPs)
	return &c
}

// pod is the Pod the policy reads.
func (p *trafficPod) pod() corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{HostNetwork: p.hostNetwork},
		Status:     corev1.PodStatus{Phase: p.phase, PodIPs: p.podIPs},
	}
}

// podForTraffic keeps of a pod a trafficPod.
func podForTraffic(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &trafficPod{
		ObjectMeta:  metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
		hostNetwork: p.Spec.HostNetwork, phase: p.Status.Phase, podIPs: p.Status.PodIPs,
	}, nil
}

// namespaceForTraffic keeps a namespace's name and labels (its tenant).
func namespaceForTraffic(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion, Labels: ns.Labels}}, nil
}

// Synced reports whether the informers have listed everything and the
// data plane has the first decision: until then it holds what the kernel
// had.
func (f *Feed) Synced() error {
	if !f.synced.Load() {
		return errors.New("traffic policy: informers not synced yet; the sets the kernel held at start are kept")
	}
	return nil
}

// Run feeds the data plane until ctx ends.
func (f *Feed) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { f.changed() },
		UpdateFunc: func(old, obj any) {
			if changedForTraffic(old, obj) {
				f.changed()
			}
		},
		DeleteFunc: func(any) { f.changed() },
	}
	// Only the tenants' pods are read (read): a consumer's own pods, the
	// 1000 it offloads say, would start a pass at each of their changes.
	podHandler := toolscache.FilteringResourceEventHandler{FilterFunc: f.tenantPod, Handler: handler}
	regs, err := ctrl.AddWatches(ctx, f.cache, "traffic policy",
		ctrl.On(&corev1.Namespace{}, handler), ctrl.On(&corev1.Pod{}, podHandler),
		ctrl.On(&corev1.Service{}, handler), ctrl.On(&discoveryv1.EndpointSlice{}, handler),
		ctrl.On(&v1alpha1.NamespaceOffload{}, handler), ctrl.On(&mcsv1alpha1.ServiceExport{}, handler),
		ctrl.On(&v1alpha1.Peer{}, handler),
	)
	if err != nil {
		return err
	}
	for obj, store := range map[client.Object]*toolscache.Indexer{&corev1.Pod{}: &f.pods, &corev1.Namespace{}: &f.namespaces} {
		inf, err := f.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("traffic policy: watch %T: %w", obj, err)
		}
		withStore, ok := inf.(interface{ GetIndexer() toolscache.Indexer })
		if !ok {
			return fmt.Errorf("traffic policy: the informer of %T (%T) has no store to read", obj, inf)
		}
		*store = withStore.GetIndexer()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	cacheErr, synced, err := ctrl.StartCache(ctx, &wg, f.cache, "traffic policy", regs...)
	if !synced {
		return err
	}
	f.log.Info("informers synced; deciding the Segregated peers' sets", "default", f.cfg.Default)
	f.mu.Lock()
	f.since = time.Time{} // the start is not a change's latency
	f.mu.Unlock()
	retry := time.NewTimer(0) // the first pass, at once
	defer retry.Stop()
	var last time.Time // the end of the last pass
	var failing string // the error last logged, once per change
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-cacheErr:
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("traffic policy: watch: %w", err)
			}
			return nil
		case <-f.wake:
			if wait := f.cfg.Debounce - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(wait):
				}
			}
		case <-retry.C:
		}
		err := f.pass(ctx)
		last = time.Now()
		switch {
		case err != nil && ctx.Err() == nil:
			if err.Error() != failing {
				f.log.Error("traffic policy not applied; retrying", "err", err, "every", trafficRetry)
			}
			failing = err.Error()
			retry.Reset(trafficRetry)
		case err == nil && failing != "":
			f.log.Info("traffic policy applied again")
			failing = ""
		}
	}
}

// changedForTraffic says whether an update can change a decision: pods'
// and Peers' statuses, written all the time, mostly cannot, and each
// decision reads everything.
func changedForTraffic(old, obj any) bool {
	switch o := old.(type) {
	case *trafficPod:
		n, ok := obj.(*trafficPod)
		return !ok || o.phase != n.phase || o.hostNetwork != n.hostNetwork || !slices.Equal(o.podIPs, n.podIPs)
	case *corev1.Namespace:
		n, ok := obj.(*corev1.Namespace)
		return !ok || !maps.Equal(o.Labels, n.Labels)
	case *v1alpha1.Peer:
		n, ok := obj.(*v1alpha1.Peer)
		return !ok || o.Spec.Traffic != n.Spec.Traffic || o.Status.Traffic != n.Status.Traffic ||
			!equalAllowed(o.Status.Allowed, n.Status.Allowed) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	case *mcsv1alpha1.ServiceExport:
		n, ok := obj.(*mcsv1alpha1.ServiceExport)
		return !ok || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	case *v1alpha1.NamespaceOffload:
		n, ok := obj.(*v1alpha1.NamespaceOffload)
		if !ok || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) || len(o.Status.Clusters) != len(n.Status.Clusters) {
			return true
		}
		for i, c := range o.Status.Clusters {
			if d := n.Status.Clusters[i]; c.ClusterID != d.ClusterID || c.RemoteNamespace != d.RemoteNamespace {
				return true
			}
		}
		return false
	}
	return true // Services and EndpointSlices change when what they hold does
}

// tenantPod says whether obj, a pod's event, is of a pod in a tenant
// namespace as the informer of Namespaces holds it now. A namespace
// labelled a tenant's later is a change of its own, and that pass reads
// every pod; what is not a trafficPod (a deletion's last state unknown)
// counts.
func (f *Feed) tenantPod(obj any) bool {
	p, ok := obj.(*trafficPod)
	if !ok {
		return true
	}
	o, exists, err := f.namespaces.GetByKey(p.Namespace)
	if err != nil || !exists {
		return false
	}
	ns, ok := o.(*corev1.Namespace)
	if !ok {
		return true
	}
	return tenantOfNamespace(ns) != ""
}

// changed notes a change and wakes the loop; it never blocks.
func (f *Feed) changed() {
	f.mu.Lock()
	if f.since.IsZero() {
		f.since = time.Now()
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// pass decides on everything the informers hold and applies it; then
// each Peer's status says its mode in effect.
func (f *Feed) pass(ctx context.Context) error {
	f.mu.Lock()
	since := f.since
	f.since = time.Time{}
	f.mu.Unlock()
	f.m.passes.Inc()
	objs, err := f.read(ctx)
	if err != nil {
		return err
	}
	in, problems := trafficInputOf(objs, f.cfg.Default)
	f.noteProblems(problems)
	applied, err := f.cfg.Dataplane.setInput(ctx, in)
	if err != nil {
		f.keepSince(since)
		return err
	}
	f.synced.Store(true)
	if applied && !since.IsZero() {
		f.m.latency.Observe(time.Since(since).Seconds())
	}
	return f.writeStatus(ctx, objs.Peers, in)
}

// keepSince puts back the start of a change not yet acted on.
func (f *Feed) keepSince(t time.Time) {
	f.mu.Lock()
	if !t.IsZero() && (f.since.IsZero() || t.Before(f.since)) {
		f.since = t
	}
	f.mu.Unlock()
}

// read lists what the informers hold.
func (f *Feed) read(ctx context.Context) (trafficObjects, error) {
	var (
		namespaces corev1.NamespaceList
		services   corev1.ServiceList
		slices     discoveryv1.EndpointSliceList
		offloads   v1alpha1.NamespaceOffloadList
		exports    mcsv1alpha1.ServiceExportList
		peers      v1alpha1.PeerList
	)
	for _, l := range []client.ObjectList{&namespaces, &services, &slices, &offloads, &exports, &peers} {
		// The shared Peers' cache copies what it lists unless told not
		// to: 100 Peers were 2 MB of garbage a pass.
		if err := f.cache.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return trafficObjects{}, fmt.Errorf("list %T: %w", l, err)
		}
	}
	// The pods are trafficPods, which the cache's reader cannot list as
	// Pods: read from the informer's store. Only the tenants' pods count
	// (offloadedPods): the others, a consumer's 1000 offloaded pods say,
	// are not copied at every pass.
	tenants := tenantNamespaces(namespaces.Items)
	var pods []corev1.Pod
	for _, o := range f.pods.List() {
		if p, ok := o.(*trafficPod); ok && tenants[p.Namespace] != "" {
			pods = append(pods, p.pod())
		}
	}
	return trafficObjects{Namespaces: namespaces.Items, Pods: pods, Services: services.Items, Slices: slices.Items,
		Offloads: offloads.Items, Exports: exports.Items, Peers: peers.Items}, nil
}

// maxProblemsLogged bounds what one pass logs: a dual-stack cluster has
// an IPv6 address on every pod.
const maxProblemsLogged = 10

// noteProblems logs what cannot be enforced, once per change of an
// object's error, and counts it.
func (f *Feed) noteProblems(problems []inputProblem) {
	now := map[string]string{}
	for _, p := range problems {
		if prev, ok := now[p.Object]; ok {
			now[p.Object] = prev + "; " + p.Err.Error()
		} else {
			now[p.Object] = p.Err.Error()
		}
	}
	f.mu.Lock()
	before := f.problems
	f.problems = now
	f.mu.Unlock()
	logged, more := 0, 0
	for _, obj := range slices.Sorted(maps.Keys(now)) {
		if before[obj] == now[obj] {
			continue
		}
		if logged == maxProblemsLogged {
			more++
			continue
		}
		logged++
		f.log.Warn("part of an object cannot be enforced for Segregated peers and is left out of their sets (the rest is kept)", "object", obj, "err", now[obj])
	}
	if more > 0 {
		f.log.Warn("more objects cannot be fully enforced for Segregated peers; see flotilla_policy_input_errors", "more", more)
	}
	counts := map[string]int{"Pod": 0, "EndpointSlice": 0}
	for obj := range now {
		kind, _, _ := strings.Cut(obj, " ")
		counts[kind]++
	}
	for kind, n := range counts {
		f.m.problems.WithLabelValues(kind).Set(float64(n))
	}
}
