package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/tenancy"
)

// Granter says what this provider grants a consumer now (*tenancy.Grants).
type Granter interface {
	Granted(consumer string) (grant.Limits, bool)
}

// Reasons a NamespaceRequest's status gives.
const (
	ReasonCreated       = "Created"
	ReasonPending       = "Pending"
	ReasonAlreadyExists = "AlreadyExists"
	ReasonReserved      = "Reserved"
	ReasonInvalidName   = "InvalidName"
	ReasonOverLimit     = "OverLimit"
	ReasonNotGranted    = "NotGranted"
	ReasonNotSuffixed   = "NotSuffixed"
)

// DefaultMirrorResync is how often a consumer with requests is looked at
// again without an event: a grant's limits changing, or a grant given
// after a restart, come to the provider without one.
const DefaultMirrorResync = 10 * time.Second

// ProviderConfig is what a Provider needs.
type ProviderConfig struct {
	// Config reaches this cluster's API server with the agent's
	// credentials: NamespaceRequests (every namespace) and our namespaces
	// are watched with it.
	Config *rest.Config
	// Client, when set, writes NamespaceRequests (finalizers, status)
	// instead of one made from Config; its scheme must hold v1alpha1.
	Client client.Client
	// Tenants creates and deletes the mirrored namespaces and their
	// objects.
	Tenants *tenancy.Tenants
	// Grants says which consumers are granted, with which limits.
	Grants Granter
	// AgentNamespace is the agent's own namespace, never mirrored into.
	AgentNamespace string
	// Resync is DefaultMirrorResync when zero.
	Resync time.Duration
	// Shared, when set, is where Namespaces are read from (the agent's
	// SharedCache) instead of an informer of the provider's own.
	Shared  *offload.SharedCache
	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Provider is the provider's side of namespace mirroring: it
// answers the NamespaceRequests consumers write in their tenant
// namespaces by creating namespaces for them, labelled as theirs, with
// their rights and the grant's quota, and deletes those no request wants.
// Level-triggered: one reconcile per consumer, from its requests, its
// namespaces and its grant; a restart converges without duplicates.
type Provider struct {
	cfg    ProviderConfig
	log    *slog.Logger
	cache  cache.Cache
	client client.Client
	ctrl   *ctrl.Controller[string]
	queue  ctrl.Queue[string]
	m      *mirrorMetrics

	mu      sync.Mutex
	applied map[types.UID]grant.Limits // the limits applied to each namespace
	ignored map[string]bool            // namespaces with requests we ignore, logged once
	// fenceSeen is, per namespace, the version of its fence that
	// Tenants wrote and the cache has shown since; fenceGraced the
	// version the cache had not shown yet when it was looked at, let
	// pass once.
	fenceSeen, fenceGraced map[string]string
	// answered is the status last written to each request of each
	// consumer, and the version of the request it was written onto.
	answered map[string]map[types.UID]written
}

// written is a status written onto a request at version from.
type written struct {
	from   string
	status v1alpha1.NamespaceRequestStatus
}

// NewProvider checks cfg and prepares a Provider; Run starts
// it.
func NewProvider(cfg ProviderConfig) (*Provider, error) {
	if cfg.Config == nil || cfg.Tenants == nil || cfg.Grants == nil {
		return nil, errors.New("mirror provider: API server config, tenants and grants are required")
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultMirrorResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(v1alpha1.AddToScheme(scheme), corev1.AddToScheme(scheme), networkingv1.AddToScheme(scheme)); err != nil {
		return nil, fmt.Errorf("mirror provider: scheme: %w", err)
	}
	mapper := offload.MirrorMapper()
	// Every namespace, not only ours: a request's name is checked against
	// the cache, where it cost a read of the API server before each create.
	// The fences' NetworkPolicies only: one changed or deleted is put back.
	ours := labels.SelectorFromSet(labels.Set{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})
	ca, err := cache.New(cfg.Config, cache.Options{
		Scheme: scheme, Mapper: mapper, DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{&networkingv1.NetworkPolicy{}: {Label: ours}},
	})
	if err != nil {
		return nil, fmt.Errorf("mirror provider: cache: %w", err)
	}
	ca = offload.WithShared(ca, cfg.Shared, offload.SharedNamespaces)
	c := cfg.Client
	if c == nil {
		if c, err = client.New(cfg.Config, client.Options{Scheme: scheme, Mapper: mapper}); err != nil {
			return nil, fmt.Errorf("mirror provider: client: %w", err)
		}
	}
	m := &Provider{
		cfg: cfg, log: cfg.Logger.With("component", "mirror"), cache: ca, client: c,
		applied: map[types.UID]grant.Limits{}, ignored: map[string]bool{}, fenceSeen: map[string]string{}, fenceGraced: map[string]string{},
		answered: map[string]map[types.UID]written{},
	}
	if m.m, err = newMirrorMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("mirror provider: metrics: %w", err)
	}
	m.ctrl, err = ctrl.New(ctrl.Config[string]{
		Name: "mirror", Workers: mirrorWorkers, Metrics: cfg.Metrics,
		Reconcile: func(ctx context.Context, consumer string) (time.Duration, error) {
			after, err := m.reconcile(ctx, consumer)
			m.countNamespaces(ctx)
			return after, err
		},
		Errors: &ctrl.ErrorLog[string]{Logger: m.log, Failed: "mirrored namespaces not reconciled; retrying",
			Attrs: ctrl.Named[string]("consumer")},
		Failed: func(string, error) { m.m.errors.Inc() },
	})
	if err != nil {
		return nil, fmt.Errorf("mirror provider: %w", err)
	}
	m.queue = m.ctrl.Queue()
	return m, nil
}

// GrantChanged has consumer looked at again now (a grant given, changed
// or revoked). It never blocks.
func (m *Provider) GrantChanged(consumer string) {
	if identity.ValidateClusterID(consumer) == nil {
		m.queue.Add(consumer)
	}
}

// Run watches and reconciles until ctx ends; it returns once everything
// it started has stopped.
func (m *Provider) Run(ctx context.Context) error {
	return m.ctrl.RunWithCache(ctx, ctrl.Start{
		What: "mirror provider", Cache: m.cache,
		Watches: []ctrl.Watch{
			ctrl.On(&v1alpha1.NamespaceRequest{}, m.events(m.requestConsumer)),
			ctrl.On(&corev1.Namespace{}, m.events(namespaceConsumer)),
			ctrl.On(&networkingv1.NetworkPolicy{}, m.fenceEvents()),
		},
		Synced: func(context.Context, *sync.WaitGroup) error {
			m.log.Info("mirroring namespaces for consumers")
			return nil
		},
	})
}

// fenceEvents notes each fence version Tenants wrote that the cache
// shows, and enqueues the consumer the policy belongs to.
func (m *Provider) fenceEvents() toolscache.ResourceEventHandler {
	enqueue := m.events(namespaceConsumer)
	seen := func(obj any) {
		if pol, ok := obj.(*networkingv1.NetworkPolicy); ok && pol.Name == tenancy.FencePolicy {
			m.sawFence(pol.Namespace, pol.ResourceVersion)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { seen(obj); enqueue.OnAdd(obj, false) },
		UpdateFunc: func(old, obj any) { seen(obj); enqueue.OnUpdate(old, obj) },
		DeleteFunc: enqueue.OnDelete,
	}
}

// sawFence notes that the cache shows version rv of ns's fence.
func (m *Provider) sawFence(ns, rv string) {
	if rv == "" || rv != m.cfg.Tenants.FenceApplied(ns).ResourceVersion {
		return
	}
	m.mu.Lock()
	m.fenceSeen[ns] = rv
	m.mu.Unlock()
}

// events enqueues the consumer an object belongs to.
func (m *Provider) events(consumerOf func(metav1.Object) string) toolscache.ResourceEventHandler {
	return ctrl.OnEvery(func(obj any) {
		if o, ok := obj.(metav1.Object); ok {
			if c := consumerOf(o); c != "" {
				m.queue.Add(c)
			}
		}
	})
}

// requestConsumer is the consumer whose tenant namespace holds a request;
// requests elsewhere are ignored, with a log line once per namespace.
func (m *Provider) requestConsumer(o metav1.Object) string {
	ns := o.GetNamespace()
	if c, ok := strings.CutPrefix(ns, offload.TenantPrefix); ok && identity.ValidateClusterID(c) == nil {
		return c
	}
	m.mu.Lock()
	first := !m.ignored[ns]
	m.ignored[ns] = true
	m.mu.Unlock()
	if first {
		m.log.Info("NamespaceRequests outside a tenant namespace are ignored", "namespace", ns, "request", o.GetName())
	}
	return ""
}

func namespaceConsumer(o metav1.Object) string {
	c := o.GetLabels()[offload.LabelTenant]
	if identity.ValidateClusterID(c) != nil {
		return ""
	}
	return c
}

// answer is a request's status to be.
type answer struct {
	phase           v1alpha1.RequestPhase
	reason, message string
}

// reconcile answers every request of consumer's, deletes the namespaces
// of requests being deleted, and those no request wants.
func (m *Provider) reconcile(ctx context.Context, consumer string) (time.Duration, error) {
	var tenant corev1.Namespace
	tenantOurs := false
	if err := m.cache.Get(ctx, client.ObjectKey{Name: offload.TenantNamespace(consumer)}, &tenant); err == nil {
		err := tenancy.CheckOurs(&tenant, consumer)
		tenantOurs = err == nil || errors.Is(err, tenancy.ErrTerminating)
	} else if !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("read tenant namespace: %w", err)
	}
	var requests v1alpha1.NamespaceRequestList
	if tenantOurs {
		if err := m.cache.List(ctx, &requests, client.InNamespace(offload.TenantNamespace(consumer))); err != nil {
			return 0, fmt.Errorf("list NamespaceRequests: %w", err)
		}
	}
	var namespaces corev1.NamespaceList
	if err := m.cache.List(ctx, &namespaces, client.MatchingLabelsSelector{Selector: offload.MirroredSelector(consumer)}); err != nil {
		return 0, fmt.Errorf("list mirrored namespaces: %w", err)
	}
	mirrored := map[string]*corev1.Namespace{}
	for i := range namespaces.Items {
		if ns := &namespaces.Items[i]; ns.Name != offload.TenantNamespace(consumer) {
			mirrored[ns.Name] = ns
		}
	}

	var errs []error
	wanted := map[string]bool{} // namespaces a request holds
	live := make([]*v1alpha1.NamespaceRequest, 0, len(requests.Items))
	for i := range requests.Items {
		r := &requests.Items[i]
		if r.DeletionTimestamp != nil {
			if err := m.release(ctx, consumer, r); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		live = append(live, r)
	}
	// Requests whose namespace exists count first: a new one never takes
	// the place of one that has its namespace.
	has := func(r *v1alpha1.NamespaceRequest) bool {
		ns := mirrored[r.Name]
		return ns != nil && tenancy.MirroredFor(ns, consumer, r.Spec.SourceNamespace)
	}
	slices.SortStableFunc(live, func(a, b *v1alpha1.NamespaceRequest) int {
		if ha, hb := has(a), has(b); ha != hb {
			if ha {
				return -1
			}
			return 1
		}
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	limits, granted := m.cfg.Grants.Granted(consumer)
	// A tenant being removed gets nothing new, whatever the grant says
	// while the revocation runs.
	granted = granted && tenant.DeletionTimestamp == nil
	// Decided one after another, in the order above (the count), then
	// acted on at once: a consumer's hundred requests do not wait for
	// each other's round trips.
	count := int64(0)
	answers := make([]answer, len(live))
	failed := make([]error, len(live))
	fencedNow := make([]bool, len(live)) // its fence applied by act

	acting := make(chan struct{}, mirrorActing)
	var wg sync.WaitGroup
	for i, r := range live {
		a, ns, act, err := m.decide(ctx, consumer, r, mirrored[r.Name], limits, granted, &count)
		acting <- struct{}{}
		wg.Go(func() {
			defer func() { <-acting }()
			if act {
				a, fencedNow[i], err = m.act(ctx, consumer, r, ns, limits)
			}
			if err != nil {
				err = fmt.Errorf("request %s: %w", r.Name, err)
			}
			answers[i], failed[i] = a, errors.Join(err, m.writeStatus(ctx, consumer, r, a))
		})
	}
	wg.Wait()
	m.forgetAnswers(consumer, requests.Items)
	errs = append(errs, failed...)
	for i, r := range live {
		if a := answers[i]; a.phase == v1alpha1.RequestCreated || a.reason == ReasonNotGranted || a.reason == ReasonPending {
			wanted[r.Name] = true
		}
	}
	recheck := false
	if granted && tenantOurs {
		fenced := []string{tenant.Name}
		for i, r := range live {
			if answers[i].phase == v1alpha1.RequestCreated && !fencedNow[i] {
				fenced = append(fenced, r.Name)
			}
		}
		var err error
		recheck, err = m.keepFences(ctx, consumer, fenced)
		errs = append(errs, err)
	}
	for name, ns := range mirrored {
		if wanted[name] || ns.DeletionTimestamp != nil || m.held(requests.Items, ns) {
			continue
		}
		m.log.Info("mirrored namespace without a request deleted", "consumer", consumer, "namespace", name,
			"source", ns.Labels[v1alpha1.LabelMirroredFrom])
		errs = append(errs, m.cfg.Tenants.DeleteMirrored(ctx, ns))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	after := time.Duration(0)
	if len(requests.Items) > 0 {
		after = m.cfg.Resync
	}
	if recheck && (after == 0 || after > fenceRecheck) {
		after = fenceRecheck
	}
	return after, nil
}

// fenceRecheck is when a consumer is looked at again after a fence was
// let pass because the cache had not shown Tenants' write of it yet: the
// write's own event normally comes first.
const fenceRecheck = time.Second

// keepFences puts back the NetworkPolicy of each of namespaces (the
// consumer's) that is missing or not as Tenants last wrote it (for a
// grant, or a namespace mirrored): deleted or changed by someone, or made
// of addresses (nodes, the API server's, the cluster DNS's) that have
// changed since. The first pass after a start writes each once, a no-op
// where it is as it should be. A write the cache has not shown yet (a
// grant's, just made) is let pass once, not written again: again asks to
// look back soon.
func (m *Provider) keepFences(ctx context.Context, consumer string, namespaces []string) (again bool, err error) {
	gen, err := m.cfg.Tenants.FenceGeneration(ctx)
	if err != nil {
		return false, fmt.Errorf("fences of %s: %w", consumer, err)
	}
	var errs []error
	for _, ns := range namespaces {
		var pol networkingv1.NetworkPolicy
		err := m.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: tenancy.FencePolicy}, &pol)
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("read NetworkPolicy %s/%s: %w", ns, tenancy.FencePolicy, err))
			continue
		}
		wrote := m.cfg.Tenants.FenceApplied(ns)
		current := err == nil && wrote.ResourceVersion != "" && pol.ResourceVersion == wrote.ResourceVersion
		if current && wrote.Generation >= gen {
			m.sawFence(ns, wrote.ResourceVersion)
			continue
		}
		m.mu.Lock()
		pending := !current && wrote.ResourceVersion != "" && wrote.Generation >= gen &&
			m.fenceSeen[ns] != wrote.ResourceVersion && m.fenceGraced[ns] != wrote.ResourceVersion
		if pending {
			m.fenceGraced[ns] = wrote.ResourceVersion
		}
		m.mu.Unlock()
		if pending {
			again = true
			continue
		}
		switch {
		case current:
			m.log.Debug("fence of a consumer's namespace rewritten: the addresses it is made of changed", "consumer", consumer, "namespace", ns)
		case wrote.ResourceVersion != "":
			m.log.Info("fence of a consumer's namespace put back", "consumer", consumer, "namespace", ns, "policy", tenancy.FencePolicy,
				"deleted", apierrors.IsNotFound(err))
		}
		if _, err := m.cfg.Tenants.ApplyFence(ctx, consumer, ns); err != nil {
			errs = append(errs, err)
		}
	}
	return again, errors.Join(errs...)
}

// held reports whether a request being deleted still holds ns: release
// deletes it and then lets the request go.
func (m *Provider) held(requests []v1alpha1.NamespaceRequest, ns *corev1.Namespace) bool {
	for _, r := range requests {
		if r.Name == ns.Name && r.DeletionTimestamp != nil && slices.Contains(r.Finalizers, v1alpha1.FinalizerRequest) {
			return true
		}
	}
	return false
}

// mirrorActing bounds the requests of one consumer acted on (and their
// status written) at once.
const mirrorActing = 8

// decide answers a live request from what the cache holds, or says to act
// on it (act), with the namespace of its name that is the consumer's (nil:
// none yet). count is the consumer's namespaces so far. mirrored is the
// namespace of that name mirrored for the consumer, if any.
func (m *Provider) decide(ctx context.Context, consumer string, r *v1alpha1.NamespaceRequest, mirrored *corev1.Namespace, limits grant.Limits, granted bool, count *int64) (a answer, ns *corev1.Namespace, act bool, err error) {
	src := r.Spec.SourceNamespace
	switch {
	case !granted:
		return answer{v1alpha1.RequestRefused, ReasonNotGranted, "this cluster does not grant " + consumer + " offloading now; its admin grants it with `flotilla grant`"}, nil, false, nil
	case offload.ValidNamespaceName(r.Name) != nil:
		return answer{v1alpha1.RequestRefused, ReasonInvalidName, offload.ValidNamespaceName(r.Name).Error() + ": a namespace name is lowercase letters, digits and '-', at most 63 characters"}, nil, false, nil
	case offload.ValidNamespaceName(src) != nil:
		return answer{v1alpha1.RequestRefused, ReasonInvalidName, "spec.sourceNamespace: " + offload.ValidNamespaceName(src).Error()}, nil, false, nil
	case tenancy.ReservedNamespace(r.Name, m.cfg.AgentNamespace):
		return answer{v1alpha1.RequestRefused, ReasonReserved, fmt.Sprintf("namespace %s is reserved on this cluster (default, kube-*, flotilla-*, openshift-* and the agent's own); choose another remote name", r.Name)}, nil, false, nil
	}
	ns = mirrored
	if ns == nil {
		// The cache holds every namespace: one not in it is created at
		// once; one created since the cache saw none fails the create,
		// which then reads it.
		var got corev1.Namespace
		switch err := m.cache.Get(ctx, client.ObjectKey{Name: r.Name}, &got); {
		case err == nil:
			ns = &got
		case !apierrors.IsNotFound(err):
			return answer{v1alpha1.RequestPending, ReasonPending, "cannot read namespace " + r.Name + "; retrying"}, nil, false, fmt.Errorf("read namespace %s: %w", r.Name, err)
		}
	}
	if ns != nil && !tenancy.MirroredFor(ns, consumer, src) {
		return answer{v1alpha1.RequestRefused, ReasonAlreadyExists, alreadyExists(r.Name, consumer, src)}, nil, false, nil
	}
	// A new namespace only under the consumer's suffix, unless the admin
	// lets it choose: otherwise it could take a name this cluster's own
	// workloads want (monitoring, argocd) before they do.
	if ns == nil && !limits.Fence.AnyNamespaceName && !offload.Suffixed(r.Name, consumer) {
		return answer{v1alpha1.RequestRefused, ReasonNotSuffixed, fmt.Sprintf("this cluster mirrors namespaces for %s only under names that end in -%s (namespaceMapping DefaultName); "+
			"its admin may allow other names with spec.offloadLimits.namespaceNames: Any on the Peer of %s", consumer, offload.ClusterSuffix(consumer), consumer)}, nil, false, nil
	}
	if limit := tenancy.NamespaceLimit(limits); ns == nil && *count >= limit {
		return answer{v1alpha1.RequestRefused, ReasonOverLimit, fmt.Sprintf("%s has %d namespaces mirrored here, as many as its grant allows (%d); delete one or ask for a higher limit", consumer, *count, limit)}, nil, false, nil
	}
	*count++
	if ns != nil && ns.DeletionTimestamp != nil {
		return answer{v1alpha1.RequestPending, ReasonPending, "namespace " + r.Name + " is being deleted; it is created again once gone"}, nil, false, nil
	}
	return answer{}, ns, true, nil
}

// act creates the namespace of a request decide let through (ns: the
// consumer's namespace of that name, nil when there is none yet), or
// brings its objects to the grant's limits; fenced says it applied the
// namespace's fence (its NetworkPolicy) too.
func (m *Provider) act(ctx context.Context, consumer string, r *v1alpha1.NamespaceRequest, ns *corev1.Namespace, limits grant.Limits) (a answer, fenced bool, err error) {
	src := r.Spec.SourceNamespace
	m.mu.Lock()
	applied, done := limits, false
	if ns != nil {
		applied, done = m.applied[ns.UID]
	}
	m.mu.Unlock()
	if done && applied == limits {
		if err := m.addFinalizer(ctx, r); err != nil {
			return answer{v1alpha1.RequestPending, ReasonPending, "retrying"}, false, err
		}
		return answer{v1alpha1.RequestCreated, ReasonCreated, createdMessage(r.Name, consumer)}, false, nil
	}
	// The finalizer goes on while the namespace is made: a namespace whose
	// request lost it (deleted meanwhile, a failed patch) is one no
	// request wants, which the next reconcile deletes.
	var finalized error
	var wg sync.WaitGroup
	wg.Go(func() { finalized = m.addFinalizer(ctx, r) })
	got, _, created, err := m.cfg.Tenants.EnsureMirrored(ctx, consumer, r.Name, src, limits, ns)
	wg.Wait()
	switch {
	case errors.Is(err, tenancy.ErrNotOurs):
		return answer{v1alpha1.RequestRefused, ReasonAlreadyExists, alreadyExists(r.Name, consumer, src)}, false, finalized
	case errors.Is(err, tenancy.ErrTerminating):
		return answer{v1alpha1.RequestPending, ReasonPending, "namespace " + r.Name + " is being deleted; it is created again once gone"}, false, finalized
	case err != nil:
		return answer{v1alpha1.RequestPending, ReasonPending, "creating the namespace failed; retrying: " + err.Error()}, false, errors.Join(err, finalized)
	case finalized != nil:
		return answer{v1alpha1.RequestPending, ReasonPending, "retrying"}, false, finalized
	}
	if created {
		m.log.Info("namespace mirrored", "consumer", consumer, "namespace", r.Name, "source", src)
	}
	m.mu.Lock()
	m.applied[got.UID] = limits
	m.mu.Unlock()
	return answer{v1alpha1.RequestCreated, ReasonCreated, createdMessage(r.Name, consumer)}, true, nil
}

func alreadyExists(ns, consumer, source string) string {
	return fmt.Sprintf("namespace %s exists on this cluster and is not mirrored for %s from %s; it is left alone: choose another remote name", ns, consumer, source)
}

func createdMessage(ns, consumer string) string {
	return "namespace " + ns + " is " + consumer + "'s, with its rights and the grant's limits"
}

// release deletes a deleted request's namespace and, once it is gone,
// lets the request go.
func (m *Provider) release(ctx context.Context, consumer string, r *v1alpha1.NamespaceRequest) error {
	if !slices.Contains(r.Finalizers, v1alpha1.FinalizerRequest) {
		return nil
	}
	ns, err := m.cfg.Tenants.Client.CoreV1().Namespaces().Get(ctx, r.Name, metav1.GetOptions{})
	switch {
	case err == nil && tenancy.MirroredFor(ns, consumer, r.Spec.SourceNamespace):
		if ns.DeletionTimestamp == nil {
			m.log.Info("namespace of a deleted request deleted", "consumer", consumer, "namespace", ns.Name)
		}
		// Its deletion event brings the request back here.
		return m.cfg.Tenants.DeleteMirrored(ctx, ns)
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("release request %s: read namespace: %w", r.Name, err)
	}
	patch := client.MergeFromWithOptions(r.DeepCopy(), client.MergeFromWithOptimisticLock{})
	r.Finalizers = slices.DeleteFunc(slices.Clone(r.Finalizers), func(f string) bool { return f == v1alpha1.FinalizerRequest })
	if err := m.client.Patch(ctx, r, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("release request %s: remove finalizer: %w", r.Name, err)
	}
	return nil
}

func (m *Provider) addFinalizer(ctx context.Context, r *v1alpha1.NamespaceRequest) error {
	if slices.Contains(r.Finalizers, v1alpha1.FinalizerRequest) {
		return nil
	}
	patch := client.MergeFromWithOptions(r.DeepCopy(), client.MergeFromWithOptimisticLock{})
	r.Finalizers = append(slices.Clone(r.Finalizers), v1alpha1.FinalizerRequest)
	if err := m.client.Patch(ctx, r, patch); err != nil {
		return fmt.Errorf("request %s: add finalizer: %w", r.Name, err)
	}
	return nil
}

// writeStatus patches a's status onto r when it says something else. A
// request still at the version this controller last wrote its status
// onto, with that status wanted again, is one the cache shows from
// before that write: it is not written twice.
func (m *Provider) writeStatus(ctx context.Context, consumer string, r *v1alpha1.NamespaceRequest, a answer) error {
	want := v1alpha1.NamespaceRequestStatus{Phase: a.phase, Reason: a.reason, Message: a.message, ObservedGeneration: r.Generation}
	m.mu.Lock()
	last, ok := m.answered[consumer][r.UID]
	m.mu.Unlock()
	if r.Status == want || (ok && last.from == r.ResourceVersion && last.status == want) {
		return nil
	}
	from := r.ResourceVersion
	patch := client.MergeFrom(r.DeepCopy())
	r.Status = want
	if err := m.client.Status().Patch(ctx, r, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("request %s: write status: %w", r.Name, err)
	}
	m.mu.Lock()
	if m.answered[consumer] == nil {
		m.answered[consumer] = map[types.UID]written{}
	}
	m.answered[consumer][r.UID] = written{from: from, status: want}
	m.mu.Unlock()
	m.m.requests.WithLabelValues(a.reason).Inc()
	if a.phase == v1alpha1.RequestRefused {
		m.log.Info("namespace request refused", "namespace", r.Namespace, "request", r.Name, "reason", a.reason, "message", a.message)
	}
	return nil
}

// forgetAnswers forgets the statuses written to consumer's requests that
// are gone.
func (m *Provider) forgetAnswers(consumer string, requests []v1alpha1.NamespaceRequest) {
	live := make(map[types.UID]bool, len(requests))
	for _, r := range requests {
		live[r.UID] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	maps.DeleteFunc(m.answered[consumer], func(uid types.UID, _ written) bool { return !live[uid] })
	if len(m.answered[consumer]) == 0 {
		delete(m.answered, consumer)
	}
}

// countNamespaces sets the gauge from the cache, and forgets what was
// applied to namespaces gone.
func (m *Provider) countNamespaces(ctx context.Context) {
	var list corev1.NamespaceList
	if err := m.cache.List(ctx, &list, client.MatchingLabelsSelector{Selector: offload.MirroredSelector("")}); err != nil {
		return
	}
	n, present := 0, map[types.UID]bool{}
	for _, ns := range list.Items {
		present[ns.UID] = true
		if ns.DeletionTimestamp == nil && ns.Name != offload.TenantNamespace(ns.Labels[offload.LabelTenant]) {
			n++
		}
	}
	m.m.namespaces.Set(float64(n))
	// Forget namespaces gone; one created since the cache saw it is only
	// applied again.
	names := map[string]bool{}
	for _, ns := range list.Items {
		names[ns.Name] = true
	}
	m.mu.Lock()
	maps.DeleteFunc(m.applied, func(uid types.UID, _ grant.Limits) bool { return !present[uid] })
	gone := func(ns, _ string) bool { return !names[ns] && !strings.HasPrefix(ns, offload.TenantPrefix) }
	maps.DeleteFunc(m.fenceSeen, gone)
	maps.DeleteFunc(m.fenceGraced, gone)
	m.mu.Unlock()
}

type mirrorMetrics struct {
	requests   *prometheus.CounterVec
	namespaces prometheus.Gauge
	errors     prometheus.Counter
}

func newMirrorMetrics(reg prometheus.Registerer) (*mirrorMetrics, error) {
	m := &mirrorMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_mirror_requests_total",
			Help: "NamespaceRequests answered, by result (the status reason written: Created, AlreadyExists, Reserved, InvalidName, NotSuffixed, OverLimit, NotGranted, Pending).",
		}, []string{"result"}),
		namespaces: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flotilla_mirror_namespaces",
			Help: "Namespaces this provider holds mirrored for consumers.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_mirror_reconcile_errors_total",
			Help: "Reconciles of a consumer's mirrored namespaces that failed and were retried.",
		}),
	}
	return m, ctrl.Register(reg, m.requests, m.namespaces, m.errors)
}
