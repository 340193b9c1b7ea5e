package reflection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
)

// hostedEndpointsFieldManager writes the translated slices.
const hostedEndpointsFieldManager = "flotilla-hosted-endpoints"

// HostedEndpointsConfig is what a HostedEndpoints needs.
type HostedEndpointsConfig struct {
	// Config reaches this cluster's API server with the agent's
	// credentials: EndpointSlices (every namespace), the namespaces
	// mirrored for consumers and the Peers are read with it, and the
	// translated slices written.
	Config *rest.Config
	// Self is this cluster's ID: a consumer cannot name it as a third
	// cluster (its own pods are no third cluster's).
	Self string
	// Views translates a peer's own addresses into this cluster's view
	// of it (Translate; the agent's ledger, ToLocal).
	Views offload.Views
	// Workers is how many slices are translated at once
	// (DefaultHostedEndpointsWorkers when zero).
	Workers int
	// Peers, when set, is where Peers are read and watched, shared with
	// the agent's other components (PeerCache); a cache of its own when
	// nil.
	Peers   offload.PeerCache
	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// DefaultHostedEndpointsWorkers: each translation is one write.
const DefaultHostedEndpointsWorkers = 2

// HostedEndpoints is the provider's side of endpoints on third clusters
// (docs/services.md, "Endpoints on third clusters"): a consumer writes,
// in a namespace mirrored for it, a slice of its endpoints on a third
// cluster B in B's own addresses (LabelEndpointsOf, no
// kubernetes.io/service-name); this controller translates each address
// by this cluster's view of B into a slice of its own that kube-proxy
// routes by, owned by the consumer's slice. Only a peer of this cluster
// can be named, and only addresses in a view of it pass: a consumer can
// make this cluster route only where it already has a view.
type HostedEndpoints struct {
	cfg    HostedEndpointsConfig
	log    *slog.Logger
	cache  cache.Cache
	client client.Client
	ctrl   *ctrl.Controller[types.NamespacedName]
	queue  ctrl.Queue[types.NamespacedName]
	m      *hostedMetrics

	mu sync.Mutex
	// decided is, per source slice, the resourceVersion and reason whose
	// refusal or drops were counted and logged: once per change, not per
	// resync.
	decided map[types.NamespacedName]string
}

type hostedMetrics struct {
	translated *prometheus.CounterVec
	dropped    *prometheus.CounterVec
}

func newHostedMetrics(reg prometheus.Registerer) (*hostedMetrics, error) {
	m := &hostedMetrics{
		translated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_hosted_endpoints_translated_total",
			Help: "Endpoints on third clusters a consumer reflected here, translated into this cluster's view of that cluster, counted at each write, by consumer and third cluster.",
		}, []string{"consumer", "cluster"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_hosted_endpoints_dropped_total",
			Help: "Endpoints on third clusters a consumer reflected here and left out, counted once per change of its slice, by consumer and reason (untranslatable: outside this cluster's views of that cluster; unknown_cluster: not a peer of this cluster; invalid: not a slice a consumer's reflection writes).",
		}, []string{"consumer", "reason"}),
	}
	return m, ctrl.Register(reg, m.translated, m.dropped)
}

// hostedMapper knows every kind a HostedEndpoints reads or writes.
func hostedMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	m.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	m.Add(discoveryv1.SchemeGroupVersion.WithKind(kindEndpointSlice), meta.RESTScopeNamespace)
	return m
}

// NewHostedEndpoints checks cfg and prepares a HostedEndpoints; Run
// starts it.
func NewHostedEndpoints(cfg HostedEndpointsConfig) (*HostedEndpoints, error) {
	if cfg.Config == nil || cfg.Views == nil {
		return nil, errors.New("endpoints on third clusters: the REST config and the views are required")
	}
	if err := identity.ValidateClusterID(cfg.Self); err != nil {
		return nil, fmt.Errorf("endpoints on third clusters: this cluster's ID: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultHostedEndpointsWorkers
	}
	// Both the consumers' slices and ours carry LabelEndpointsOf: one
	// watch holds both, and nothing else of the cluster's slices.
	of, err := labels.NewRequirement(offload.LabelEndpointsOf, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	c, err := cache.New(cfg.Config, cache.Options{
		Scheme: reflectScheme(), Mapper: hostedMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {Label: labels.NewSelector().Add(*of)},
			&corev1.Namespace{}:          {Label: offload.MirroredSelector("")},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("endpoints on third clusters: cache: %w", err)
	}
	w, err := client.New(cfg.Config, client.Options{Scheme: reflectScheme(), Mapper: hostedMapper()})
	if err != nil {
		return nil, fmt.Errorf("endpoints on third clusters: client: %w", err)
	}
	h := &HostedEndpoints{
		cfg: cfg, log: cfg.Logger.With("component", "hosted-endpoints"), cache: offload.WithShared(c, cfg.Peers, offload.SharedNamespaces), client: w,
		decided: map[types.NamespacedName]string{},
	}
	if h.m, err = newHostedMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("endpoints on third clusters: metrics: %w", err)
	}
	h.ctrl, err = ctrl.New(ctrl.Config[types.NamespacedName]{
		Name: "hosted_endpoints", Workers: cfg.Workers, MaxDelay: 30 * time.Second,
		Reconcile: ctrl.WithoutDelay(h.reconcile), Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[types.NamespacedName]{Logger: h.log, Failed: "not translated; retrying", Recovered: "translated again",
			Attrs: func(k types.NamespacedName) []any { return []any{"slice", k.String()} }},
	})
	if err != nil {
		return nil, fmt.Errorf("endpoints on third clusters: %w", err)
	}
	h.queue = h.ctrl.Queue()
	return h, nil
}

// Run translates until ctx ends; it returns once every goroutine it
// started has.
func (h *HostedEndpoints) Run(ctx context.Context) error {
	// A peer not read yet would make a source look refused, and its
	// translation be deleted.
	return h.ctrl.RunWithCache(ctx, ctrl.Start{
		What: "endpoints on third clusters", Cache: h.cache,
		Watches: []ctrl.Watch{
			ctrl.On(&discoveryv1.EndpointSlice{}, ctrl.OnEvery(h.sliceChanged)),
			// A namespace mirrored or no longer, a peer come or gone: every
			// source in it, or everywhere, is decided again.
			ctrl.On(&corev1.Namespace{}, ctrl.OnEvery(func(obj any) {
				if ns, ok := obj.(*corev1.Namespace); ok {
					h.queueSources(ns.Name)
				}
			})),
			ctrl.On(&v1alpha1.Peer{}, ctrl.OnEvery(func(any) { h.queueSources("") })),
		},
		Synced: func(context.Context, *sync.WaitGroup) error {
			h.queueSources("")
			return nil
		},
	})
}

// sliceChanged queues the source a slice is or was translated from.
func (h *HostedEndpoints) sliceChanged(obj any) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	if s.Labels[discoveryv1.LabelManagedBy] != offload.HostedEndpointsManagedBy {
		h.queue.Add(types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
		return
	}
	if owner := metav1.GetControllerOf(s); owner != nil && owner.Kind == kindEndpointSlice {
		h.queue.Add(types.NamespacedName{Namespace: s.Namespace, Name: owner.Name})
	}
}

// queueSources queues every consumer's slice in ns ("" for all).
func (h *HostedEndpoints) queueSources(ns string) {
	var list discoveryv1.EndpointSliceList
	if err := h.cache.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return
	}
	for _, s := range list.Items {
		if s.Labels[discoveryv1.LabelManagedBy] != offload.HostedEndpointsManagedBy {
			h.queue.Add(types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
		}
	}
}

// reconcile brings the translation of the consumer's slice key in line:
// written when the slice is a consumer's in a namespace mirrored for it
// and names a peer, deleted when not.
func (h *HostedEndpoints) reconcile(ctx context.Context, key types.NamespacedName) error {
	want, consumer, err := h.desired(ctx, key)
	if err != nil {
		return err
	}
	name := hostedSliceName(key.Name)
	var current discoveryv1.EndpointSlice
	switch err := h.cache.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: name}, &current); {
	case apierrors.IsNotFound(err):
		if want == nil {
			return nil
		}
		return h.create(ctx, want, consumer)
	case err != nil:
		return fmt.Errorf("read EndpointSlice %s/%s: %w", key.Namespace, name, err)
	}
	if !translatedFrom(&current, key.Name) {
		// A consumer's object of that name: never ours to touch.
		return fmt.Errorf("EndpointSlice %s/%s is not a translation of %s (label %s=%s and owner): left alone",
			key.Namespace, name, key.Name, discoveryv1.LabelManagedBy, offload.HostedEndpointsManagedBy)
	}
	if want == nil {
		uid := current.UID
		err := h.client.Delete(ctx, &current, client.Preconditions{UID: &uid})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete EndpointSlice %s/%s: %w", key.Namespace, name, err)
		}
		return nil
	}
	eq := apiequality.Semantic.DeepEqual
	if eq(current.Labels, want.Labels) && eq(current.OwnerReferences, want.OwnerReferences) &&
		current.AddressType == want.AddressType && eq(current.Endpoints, want.Endpoints) && eq(current.Ports, want.Ports) {
		return nil
	}
	u := current.DeepCopy()
	u.Labels, u.OwnerReferences, u.Endpoints, u.Ports = want.Labels, want.OwnerReferences, want.Endpoints, want.Ports
	if u.AddressType != want.AddressType {
		// Immutable: the old one goes, the new one comes on the retry.
		uid := current.UID
		if err := h.client.Delete(ctx, &current, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete EndpointSlice %s/%s of another address type: %w", key.Namespace, name, err)
		}
		return fmt.Errorf("EndpointSlice %s/%s changed address type: deleted, made again", key.Namespace, name)
	}
	if err := h.client.Update(ctx, u, client.FieldOwner(hostedEndpointsFieldManager)); err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", key.Namespace, name, err)
	}
	h.countTranslated(want, consumer)
	return nil
}

// countTranslated counts the endpoints of want, written for consumer;
// a slice written empty (every endpoint dropped, counted as such) makes
// no series, so that none is made again for a consumer forgotten while
// its slices are emptied.
func (h *HostedEndpoints) countTranslated(want *discoveryv1.EndpointSlice, consumer string) {
	if n := len(want.Endpoints); n > 0 {
		h.m.translated.WithLabelValues(consumer, want.Labels[offload.LabelEndpointsOf]).Add(float64(n))
	}
}

func (h *HostedEndpoints) create(ctx context.Context, want *discoveryv1.EndpointSlice, consumer string) error {
	err := h.client.Create(ctx, want, client.FieldOwner(hostedEndpointsFieldManager))
	switch {
	case err == nil:
		h.countTranslated(want, consumer)
		return nil
	case apierrors.IsAlreadyExists(err):
		// Not in the watch: not labelled as any of this, so not ours.
		return fmt.Errorf("EndpointSlice %s/%s exists and is not a translation: left alone", want.Namespace, want.Name)
	}
	return fmt.Errorf("create EndpointSlice %s/%s: %w", want.Namespace, want.Name, err)
}

// desired is the translation of key, or nil when there should be none;
// what is refused or dropped is counted and logged once per change of
// the source.
func (h *HostedEndpoints) desired(ctx context.Context, key types.NamespacedName) (want *discoveryv1.EndpointSlice, consumer string, err error) {
	var src discoveryv1.EndpointSlice
	switch err := h.cache.Get(ctx, key, &src); {
	case apierrors.IsNotFound(err):
		h.forget(key)
		return nil, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("read EndpointSlice %s: %w", key, err)
	}
	if src.DeletionTimestamp != nil || src.Labels[discoveryv1.LabelManagedBy] == offload.HostedEndpointsManagedBy {
		return nil, "", nil
	}
	var ns corev1.Namespace
	switch err := h.cache.Get(ctx, client.ObjectKey{Name: key.Namespace}, &ns); {
	case apierrors.IsNotFound(err):
		return nil, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("read namespace %s: %w", key.Namespace, err)
	case !offload.MirroredSelector("").Matches(labels.Set(ns.Labels)):
		// Not mirrored for a consumer: not ours to read. The shared
		// cache holds every namespace.
		return nil, "", nil
	}
	consumer = ns.Labels[offload.LabelTenant]
	from, err := decodeThirdSlice(&src)
	if err != nil {
		h.refused(key, &src, consumer, hostedDropInvalid, len(src.Endpoints), err)
		return nil, "", nil
	}
	if from.cluster == h.cfg.Self {
		h.refused(key, &src, consumer, hostedDropUnknownCluster, len(src.Endpoints), errors.New("names this cluster"))
		return nil, "", nil
	}
	var peer v1alpha1.Peer
	switch err := h.cache.Get(ctx, client.ObjectKey{Name: from.cluster}, &peer); {
	case apierrors.IsNotFound(err):
		h.refused(key, &src, consumer, hostedDropUnknownCluster, len(src.Endpoints), fmt.Errorf("cluster %s is not a peer of this cluster", from.cluster))
		return nil, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("read Peer %s: %w", from.cluster, err)
	}
	want, dropped := translateThird(&src, from, h.cfg.Views.Translate)
	if dropped > 0 {
		h.refused(key, &src, consumer, hostedDropUntranslatable, dropped,
			fmt.Errorf("%d endpoints outside this cluster's views of %s", dropped, from.cluster))
	}
	return want, consumer, nil
}

// refused counts n endpoints of src dropped for reason, and logs why,
// once per change of src.
func (h *HostedEndpoints) refused(key types.NamespacedName, src *discoveryv1.EndpointSlice, consumer, reason string, n int, why error) {
	h.mu.Lock()
	decision := src.ResourceVersion + "/" + reason
	seen := h.decided[key] == decision
	h.decided[key] = decision
	h.mu.Unlock()
	if seen {
		return
	}
	h.m.dropped.WithLabelValues(consumer, reason).Add(float64(n))
	h.log.Warn("endpoints on a third cluster not translated", "slice", key.String(), "consumer", consumer, "reason", reason, "endpoints", n, "err", why)
}

func (h *HostedEndpoints) forget(key types.NamespacedName) {
	h.mu.Lock()
	delete(h.decided, key)
	h.mu.Unlock()
}

// translatedFrom reports whether s is the translation of the slice src:
// labelled as ours and owned by it.
func translatedFrom(s *discoveryv1.EndpointSlice, src string) bool {
	owner := metav1.GetControllerOf(s)
	return s.Labels[discoveryv1.LabelManagedBy] == offload.HostedEndpointsManagedBy && owner != nil &&
		owner.Kind == kindEndpointSlice && owner.Name == src
}
