package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// TenantFieldManager is the field manager of everything Tenants applies.
const TenantFieldManager = "flotilla-tenants"

// GrantSecretType is the type of the Secret tokens are bound to; it holds
// no data.
const GrantSecretType corev1.SecretType = "flotilla.io/grant"

// Token lifetimes: the TokenRequest API refuses less than 10 minutes.
const (
	DefaultLifetime = time.Hour
	MinLifetime     = 10 * time.Minute
)

// Default requests of a container that names none, in a tenant whose CPU
// or memory is limited: without them the quota refuses such pods. Small,
// like a sidecar's, so a consumer that forgets requests still fits many
// pods; a limit below the default lowers it to the limit.
var (
	DefaultCPURequest    = resource.MustParse("100m")
	DefaultMemoryRequest = resource.MustParse("128Mi")
)

var (
	// ErrForeignNamespace is a namespace named like a tenant that is not
	// ours (or is another consumer's): it is never adopted or changed.
	ErrForeignNamespace = errors.New("namespace is not a flotilla tenant of this consumer")
	// ErrTerminating is a tenant namespace still being deleted: retry
	// once it is gone.
	ErrTerminating = errors.New("tenant namespace is being deleted")
)

// TenantsConfig configures Tenants.
type TenantsConfig struct {
	// Config reaches the provider's own API server with the agent's
	// credentials. Issued tokens are checked against the same server
	// (without those credentials).
	Config *rest.Config
	// Client, when set, is used instead of one made from Config.
	Client kubeclient.Interface
	// Audience of the tokens issued; DefaultAudience when empty.
	Audience string
	// Lifetime of the tokens issued; DefaultLifetime when zero, at least
	// MinLifetime.
	Lifetime time.Duration
	Logger   *slog.Logger
	// Metrics, when set, gets the flotilla_grant_* metrics.
	Metrics prometheus.Registerer
	// PodNetworks, when set, are this cluster's pod networks, where a
	// consumer's pods offloaded here are and its EndpointSlices may
	// point; the nodes' spec.podCIDRs when nil.
	PodNetworks func(context.Context) ([]netip.Prefix, error)
	// FenceRefresh is how long the addresses a fence denies are used
	// before they are read again; DefaultFenceRefresh when zero.
	FenceRefresh time.Duration
	// DNSService is the cluster DNS's Service, whose endpoints a
	// consumer's pods may ask on DNSPort (a DNS in the host network is at
	// node addresses, which the fence denies otherwise);
	// DefaultDNSService when empty.
	DNSService types.NamespacedName
	// DNSAddresses are DNS servers a consumer's pods may ask on DNSPort
	// besides the DNSService's endpoints, such as NodeLocal DNSCache's
	// link-local address.
	DNSAddresses []netip.Addr
}

// Tenants is the provider's side of grants in its API server: the tenant
// namespace of each consumer it grants, with what the consumer may use
// there, and the tokens it issues for it. Its calls are idempotent and
// level-triggered: a controller calls them with what it wants.
type Tenants struct {
	Client   kubeclient.Interface
	requests dynamic.NamespaceableResourceInterface // NamespaceRequests
	config   *rest.Config
	audience string
	lifetime time.Duration
	log      *slog.Logger
	metrics  *tenantMetrics

	podNetworks  func(context.Context) ([]netip.Prefix, error)
	fenceRefresh time.Duration
	dnsService   types.NamespacedName
	dnsAddresses []netip.Addr
	fence        struct {
		sync.Mutex
		addrs fenceAddresses
		at    time.Time
		gen   uint64 // 0: never read
	}

	mu    sync.Mutex
	known map[string]bool // consumers with a tenant namespace, for the gauge
	// fences is the fence ApplyFence last wrote in each namespace.
	fences map[string]Fence
}

// Tenant is what Ensure made for a consumer.
type Tenant struct {
	Consumer  string
	Namespace string
	Limits    grant.Limits
}

// NewTenants checks cfg and returns Tenants.
func NewTenants(cfg TenantsConfig) (*Tenants, error) {
	if cfg.Config == nil {
		return nil, errors.New("tenants: no API server config: tokens are checked against the provider's API server")
	}
	if cfg.Audience == "" {
		cfg.Audience = offload.DefaultAudience
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = DefaultLifetime
	}
	if cfg.Lifetime < MinLifetime {
		return nil, fmt.Errorf("tenants: token lifetime %v: the TokenRequest API refuses less than %v", cfg.Lifetime, MinLifetime)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.FenceRefresh == 0 {
		cfg.FenceRefresh = DefaultFenceRefresh
	}
	if cfg.DNSService == (types.NamespacedName{}) {
		cfg.DNSService = DefaultDNSService
	}
	if cfg.DNSService.Namespace == "" || cfg.DNSService.Name == "" {
		return nil, fmt.Errorf("tenants: cluster DNS Service %q: want namespace/name, such as %s", cfg.DNSService, DefaultDNSService)
	}
	for _, a := range cfg.DNSAddresses {
		if !a.IsValid() || a.IsUnspecified() {
			return nil, fmt.Errorf("tenants: DNS address %q: want a DNS server's address", a)
		}
	}
	if cfg.Client == nil {
		c, err := kubeclient.NewForConfig(cfg.Config)
		if err != nil {
			return nil, fmt.Errorf("tenants: client for %s: %w", cfg.Config.Host, err)
		}
		cfg.Client = c
	}
	dyn, err := dynamic.NewForConfig(cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("tenants: client for %s: %w", cfg.Config.Host, err)
	}
	t := &Tenants{
		Client: cfg.Client, requests: dyn.Resource(v1alpha1.GroupVersion.WithResource("namespacerequests")),
		config: cfg.Config, audience: cfg.Audience, lifetime: cfg.Lifetime, log: cfg.Logger, known: map[string]bool{}, fences: map[string]Fence{},
		podNetworks: cfg.PodNetworks, fenceRefresh: cfg.FenceRefresh,
		dnsService: cfg.DNSService, dnsAddresses: slices.Clone(cfg.DNSAddresses),
	}
	if t.metrics, err = newTenantMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("tenants: metrics: %w", err)
	}
	return t, nil
}

// Audience is the audience of the tokens Issue returns.
func (t *Tenants) Audience() string { return t.audience }

// Ensure makes consumer's tenant what limits say: its namespace, the
// ServiceAccount the tokens are for, its RoleBinding, the Secret the
// tokens are bound to, and the quota (none when nothing is limited). A
// namespace of that name that is not ours is refused and left alone.
func (t *Tenants) Ensure(ctx context.Context, consumer string, limits grant.Limits) (Tenant, error) {
	tenant, _, err := t.ensure(ctx, consumer, limits, false)
	return tenant, err
}

// EnsureIssued is Ensure and then Issue, overlapped: the token is
// requested as soon as the account and the Secret it is bound to exist,
// while the rest of the tenant is applied, and both are returned once
// everything is done. The namespace, just made or checked ours, is not
// read again. A token made for a tenant that then failed is dropped; a
// tenant made whose token failed is returned with the error.
func (t *Tenants) EnsureIssued(ctx context.Context, consumer string, limits grant.Limits) (Tenant, Token, error) {
	return t.ensure(ctx, consumer, limits, true)
}

func (t *Tenants) ensure(ctx context.Context, consumer string, limits grant.Limits, issue bool) (Tenant, Token, error) {
	if err := identity.ValidateClusterID(consumer); err != nil {
		return Tenant{}, Token{}, fmt.Errorf("ensure tenant: consumer: %w", err)
	}
	hard, err := quotaOf(limits)
	if err != nil {
		return Tenant{}, Token{}, fmt.Errorf("ensure tenant of %s: %w", consumer, err)
	}
	ns := offload.TenantNamespace(consumer)
	networks, err := t.allowedEndpoints(ctx, limits.Fence.EndpointNetworks)
	if err != nil {
		return Tenant{}, Token{}, fmt.Errorf("ensure tenant of %s: %w", consumer, err)
	}
	defer t.warmFence(ctx)()
	created, err := t.ensureNamespace(ctx, consumer, networks)
	if err != nil {
		return Tenant{}, Token{}, err
	}
	var tok Token
	var tokErr error
	var token func()
	if issue {
		token = func() { tok, tokErr = t.issueCounted(ctx, consumer, false) }
	}
	if err := t.applyObjects(ctx, consumer, hard, created, token); err != nil {
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			err = fmt.Errorf("%w: %w", ErrTerminating, err)
		}
		return Tenant{}, Token{}, fmt.Errorf("ensure tenant %s of %s: %w", ns, consumer, err)
	}
	t.setKnown(consumer, true)
	if created {
		t.log.Info("tenant created", "consumer", consumer, "namespace", ns)
	}
	tenant := Tenant{Consumer: consumer, Namespace: ns, Limits: limits}
	if tokErr != nil {
		return tenant, Token{}, tokErr // the tenant is made; the token failed
	}
	return tenant, tok, nil
}

// ensureNamespace creates consumer's namespace, or checks that the one of
// that name is ours. It never applies to an existing namespace: that would
// adopt a foreign one created between a read and the write. A tenant not
// known to exist is created first (the create says whether one does, so
// a new grant needs no read); one known is read first.
func (t *Tenants) ensureNamespace(ctx context.Context, consumer, networks string) (created bool, err error) {
	name := offload.TenantNamespace(consumer)
	t.mu.Lock()
	create := !t.known[consumer]
	t.mu.Unlock()
	for range 2 {
		if create {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: namespaceLabels(offload.TenantLabels(consumer)),
				Annotations: map[string]string{AnnotationEndpointNetworks: networks}}}
			_, err := t.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{FieldManager: TenantFieldManager})
			if err == nil {
				return true, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return false, fmt.Errorf("create namespace %s: %w", name, err)
			}
		}
		create = true
		ns, err := t.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted in between: create it
		}
		if err != nil {
			return false, fmt.Errorf("read namespace %s: %w", name, err)
		}
		if err := CheckOurs(ns, consumer); err != nil {
			return false, err
		}
		_, err = t.fenceNamespace(ctx, ns, networks)
		return false, err
	}
	return false, fmt.Errorf("create namespace %s: created and deleted by someone else while we tried; retry", name)
}

// CheckOurs refuses a namespace that is not consumer's tenant, or is
// going away.
func CheckOurs(ns *corev1.Namespace, consumer string) error {
	if ns.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue || ns.Labels[offload.LabelTenant] != consumer {
		return fmt.Errorf("namespace %s (labels %s=%q, %s=%q): %w %s; it is left alone: rename or delete it to grant %s",
			ns.Name, v1alpha1.LabelManagedBy, ns.Labels[v1alpha1.LabelManagedBy], offload.LabelTenant, ns.Labels[offload.LabelTenant],
			ErrForeignNamespace, consumer, consumer)
	}
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return fmt.Errorf("namespace %s of %s: %w; retry once it is gone", ns.Name, consumer, ErrTerminating)
	}
	return nil
}

// applyObjects applies what the tenant namespace holds: the account the
// tokens are for, the Secret they are bound to, and what every namespace
// of the consumer's holds; all at once, as none needs another to exist.
// fresh says the namespace was just created: it holds nothing yet.
// token, when set, runs as soon as the account and the Secret are
// applied, beside the rest.
func (t *Tenants) applyObjects(ctx context.Context, consumer string, hard corev1.ResourceList, fresh bool, token func()) error {
	ns := offload.TenantNamespace(consumer)
	core := t.Client.CoreV1()
	apply := metav1.ApplyOptions{FieldManager: TenantFieldManager, Force: true}
	lbl := offload.TenantLabels(consumer)
	var wg, account sync.WaitGroup
	errs := make([]error, 3)
	account.Add(2)
	if token != nil {
		wg.Go(func() {
			account.Wait()
			if errs[0] == nil && errs[1] == nil {
				token()
			}
		})
	}
	wg.Go(func() {
		defer account.Done()
		sa := corev1ac.ServiceAccount(offload.ConsumerServiceAccount, ns).WithLabels(lbl).
			WithAutomountServiceAccountToken(false) // its tokens leave the cluster; pods here run as others
		if _, err := core.ServiceAccounts(ns).Apply(ctx, sa, apply); err != nil {
			errs[0] = fmt.Errorf("apply ServiceAccount %s: %w", offload.ConsumerServiceAccount, err)
		}
	})
	wg.Go(func() {
		defer account.Done()
		secret := corev1ac.Secret(offload.GrantSecret, ns).WithLabels(lbl).WithType(GrantSecretType)
		errs[1] = t.applyOrReplace(ctx, consumer, "Secret "+offload.GrantSecret, func() error {
			_, err := core.Secrets(ns).Apply(ctx, secret, apply)
			return err
		}, func(opts metav1.DeleteOptions) error { return core.Secrets(ns).Delete(ctx, offload.GrantSecret, opts) })
	})
	wg.Go(func() { _, errs[2] = t.applyGrantObjects(ctx, consumer, ns, hard, fresh) })
	wg.Wait()
	return errors.Join(errs...)
}

// applyGrantObjects applies what every namespace of consumer's holds (its
// tenant namespace and those mirrored for it): the RoleBinding that gives
// it its rights there, and the grant's quota and LimitRange; each one's
// error is in the one returned. They are applied at once, but in a
// namespace that may hold pods (not fresh: created before this call) the
// LimitRange comes before the quota and goes after it, so that no pod
// without requests meets a quota without defaults. A fresh namespace has
// nothing to delete. It returns the fence as applied.
func (t *Tenants) applyGrantObjects(ctx context.Context, consumer, ns string, hard corev1.ResourceList, fresh bool) (fence Fence, err error) {
	defaults := defaultRequests(hard)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	wg.Go(func() { errs[0] = t.applyRoleBinding(ctx, consumer, ns) })
	wg.Go(func() { fence, errs[3] = t.ApplyFence(ctx, consumer, ns) })
	switch {
	case fresh:
		if len(defaults) > 0 {
			wg.Go(func() { errs[1] = t.applyLimitRange(ctx, consumer, ns, defaults) })
		}
		if len(hard) > 0 {
			wg.Go(func() { errs[2] = t.applyQuota(ctx, consumer, ns, hard) })
		}
	case len(defaults) > 0:
		wg.Go(func() {
			if errs[1] = t.applyLimitRange(ctx, consumer, ns, defaults); errs[1] == nil {
				errs[2] = t.applyQuota(ctx, consumer, ns, hard)
			}
		})
	default:
		wg.Go(func() {
			if errs[2] = t.applyQuota(ctx, consumer, ns, hard); errs[2] == nil {
				errs[1] = t.applyLimitRange(ctx, consumer, ns, defaults)
			}
		})
	}
	wg.Wait()
	return fence, errors.Join(errs...)
}

// applyRoleBinding binds ConsumerClusterRole to the consumer's account in
// ns.
func (t *Tenants) applyRoleBinding(ctx context.Context, consumer, ns string) error {
	apply := metav1.ApplyOptions{FieldManager: TenantFieldManager, Force: true}
	rbs := t.Client.RbacV1().RoleBindings(ns)
	rb := rbacv1ac.RoleBinding(offload.ConsumerServiceAccount, ns).WithLabels(offload.TenantLabels(consumer)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("ClusterRole").WithName(offload.ConsumerClusterRole)).
		WithSubjects(rbacv1ac.Subject().WithKind("ServiceAccount").WithName(offload.ConsumerServiceAccount).WithNamespace(offload.TenantNamespace(consumer)))
	return t.applyOrReplace(ctx, consumer, "RoleBinding "+offload.ConsumerServiceAccount, func() error {
		_, err := rbs.Apply(ctx, rb, apply)
		return err
	}, func(opts metav1.DeleteOptions) error { return rbs.Delete(ctx, offload.ConsumerServiceAccount, opts) })
}

// applyLimitRange applies the LimitRange that gives pods the default
// requests defaults, or deletes it when there are none.
func (t *Tenants) applyLimitRange(ctx context.Context, consumer, ns string, defaults corev1.ResourceList) error {
	lrs := t.Client.CoreV1().LimitRanges(ns)
	if len(defaults) == 0 {
		if err := lrs.Delete(ctx, offload.GrantSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete LimitRange %s (no CPU or memory limit any more): %w", offload.GrantSecret, err)
		}
		return nil
	}
	lr := corev1ac.LimitRange(offload.GrantSecret, ns).WithLabels(offload.TenantLabels(consumer)).WithSpec(corev1ac.LimitRangeSpec().WithLimits(
		corev1ac.LimitRangeItem().WithType(corev1.LimitTypeContainer).WithDefaultRequest(defaults)))
	if _, err := lrs.Apply(ctx, lr, metav1.ApplyOptions{FieldManager: TenantFieldManager, Force: true}); err != nil {
		return fmt.Errorf("apply LimitRange %s: %w", offload.GrantSecret, err)
	}
	return nil
}

// applyQuota applies the grant's ResourceQuota, or deletes it when the
// grant limits nothing it covers.
func (t *Tenants) applyQuota(ctx context.Context, consumer, ns string, hard corev1.ResourceList) error {
	quotas := t.Client.CoreV1().ResourceQuotas(ns)
	if len(hard) == 0 {
		if err := quotas.Delete(ctx, offload.GrantSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ResourceQuota %s (no limits any more): %w", offload.GrantSecret, err)
		}
		return nil
	}
	q := corev1ac.ResourceQuota(offload.GrantSecret, ns).WithLabels(offload.TenantLabels(consumer)).WithSpec(corev1ac.ResourceQuotaSpec().WithHard(hard))
	if _, err := quotas.Apply(ctx, q, metav1.ApplyOptions{FieldManager: TenantFieldManager, Force: true}); err != nil {
		return fmt.Errorf("apply ResourceQuota %s: %w", offload.GrantSecret, err)
	}
	return nil
}

// applyOrReplace applies an object and, when the API server refuses the
// apply as invalid because someone remade the object with a field no
// update may change (a RoleBinding's roleRef, a Secret's type), deletes
// it and applies again: the object is ours by its name in our namespace.
func (t *Tenants) applyOrReplace(ctx context.Context, consumer, what string, apply func() error, del func(metav1.DeleteOptions) error) error {
	err := apply()
	if !apierrors.IsInvalid(err) {
		if err != nil {
			return fmt.Errorf("apply %s: %w", what, err)
		}
		return nil
	}
	t.log.Warn("replacing an object someone changed in a way an apply cannot undo", "consumer", consumer, "object", what, "err", err)
	if err := del(metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("replace %s: delete: %w", what, err)
	}
	if err := apply(); err != nil {
		return fmt.Errorf("replace %s: apply: %w", what, err)
	}
	return nil
}

// quotaOf is the quota's hard limits: only the kinds limited.
func quotaOf(l grant.Limits) (corev1.ResourceList, error) {
	hard := corev1.ResourceList{}
	for _, q := range []struct {
		what, value string
		name        corev1.ResourceName
	}{
		{"CPU", l.CPU, corev1.ResourceRequestsCPU},
		{"memory", l.Memory, corev1.ResourceRequestsMemory},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return nil, fmt.Errorf("%s limit %q: not a Kubernetes quantity (like 4, 500m, 8Gi): %w", q.what, q.value, err)
		}
		if v.Sign() <= 0 {
			return nil, fmt.Errorf("%s limit %q: must be positive; leave it empty for no limit", q.what, q.value)
		}
		hard[q.name] = v
	}
	if l.Pods < 0 {
		return nil, fmt.Errorf("pods limit %d: must not be negative; 0 is no limit", l.Pods)
	}
	if l.Pods > 0 {
		hard[corev1.ResourcePods] = *resource.NewQuantity(l.Pods, resource.DecimalSI)
	}
	// Namespaces bound mirroring, which counts them itself; no quota here.
	if l.Namespaces < 0 {
		return nil, fmt.Errorf("namespaces limit %d: must not be negative; 0 is the default (%d)", l.Namespaces, DefaultNamespaces)
	}
	if err := objectCounts(hard, l.Fence); err != nil {
		return nil, err
	}
	return hard, nil
}

// defaultRequests are the LimitRange's defaults for the kinds of hard
// that need them, each no more than its limit.
func defaultRequests(hard corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for quota, def := range map[corev1.ResourceName]resource.Quantity{
		corev1.ResourceRequestsCPU:    DefaultCPURequest,
		corev1.ResourceRequestsMemory: DefaultMemoryRequest,
	} {
		limit, ok := hard[quota]
		if !ok {
			continue
		}
		if limit.Cmp(def) < 0 {
			def = limit
		}
		out[corev1.ResourceName(quota[len("requests."):])] = def
	}
	return out
}

// Remove revokes consumer's grant and deletes its tenant: the Secret first,
// so every token of the grant fails at once, then its tenant namespace,
// then the namespaces mirrored for it. A
// namespace that is not ours is refused and left alone; one already gone
// is success.
func (t *Tenants) Remove(ctx context.Context, consumer string) error {
	if err := identity.ValidateClusterID(consumer); err != nil {
		return fmt.Errorf("remove tenant: consumer: %w", err)
	}
	name := offload.TenantNamespace(consumer)
	ns, err := t.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Namespaces mirrored for it may outlive a tenant removed before.
		if err := t.removeMirrored(ctx, consumer); err != nil {
			return fmt.Errorf("remove tenant of %s: %w", consumer, err)
		}
		t.setKnown(consumer, false)
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove tenant of %s: read namespace %s: %w", consumer, name, err)
	}
	if err := CheckOurs(ns, consumer); err != nil && !errors.Is(err, ErrTerminating) {
		return fmt.Errorf("remove tenant of %s: %w", consumer, err)
	}
	if err := t.Client.CoreV1().Secrets(name).Delete(ctx, offload.GrantSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove tenant of %s: revoke its tokens: delete Secret %s/%s: %w", consumer, name, offload.GrantSecret, err)
	}
	if ns.DeletionTimestamp == nil {
		// The UID precondition: never a namespace of that name made since.
		err := t.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(ns.UID))})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove tenant of %s: delete namespace %s: %w", consumer, name, err)
		}
		t.log.Info("tenant removed", "consumer", consumer, "namespace", name)
	}
	t.forgetFence(name)
	// After the tenant namespace: once it is terminating, the mirroring
	// controller makes no namespace for its requests any more.
	if err := t.removeMirrored(ctx, consumer); err != nil {
		return fmt.Errorf("remove tenant of %s: %w", consumer, err)
	}
	if err := t.releaseRequests(ctx, consumer); err != nil {
		return fmt.Errorf("remove tenant of %s: %w", consumer, err)
	}
	t.setKnown(consumer, false)
	return nil
}

// List returns the consumers that have a tenant namespace of ours, sorted,
// those being deleted included: a controller removes the ones it no longer
// grants.
func (t *Tenants) List(ctx context.Context) ([]string, error) {
	managed, _ := labels.NewRequirement(v1alpha1.LabelManagedBy, selection.Equals, []string{v1alpha1.ManagedByValue})
	tenant, _ := labels.NewRequirement(offload.LabelTenant, selection.Exists, nil)
	sel := labels.NewSelector().Add(*managed, *tenant).String()
	list, err := t.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list tenant namespaces (%s): %w", sel, err)
	}
	var consumers []string
	for _, ns := range list.Items {
		// Namespaces mirrored for a consumer carry its label too.
		c := ns.Labels[offload.LabelTenant]
		if ns.Name == offload.TenantNamespace(c) && identity.ValidateClusterID(c) == nil {
			consumers = append(consumers, c)
		}
	}
	slices.Sort(consumers)
	t.mu.Lock()
	t.known = map[string]bool{}
	for _, c := range consumers {
		t.known[c] = true
	}
	t.metrics.tenants.Set(float64(len(t.known)))
	t.mu.Unlock()
	return consumers, nil
}

func (t *Tenants) setKnown(consumer string, present bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if present {
		t.known[consumer] = true
	} else {
		delete(t.known, consumer)
	}
	t.metrics.tenants.Set(float64(len(t.known)))
}

type tenantMetrics struct {
	tenants      prometheus.Gauge
	issued, fail prometheus.Counter
}

func newTenantMetrics(reg prometheus.Registerer) (*tenantMetrics, error) {
	m := &tenantMetrics{
		tenants: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flotilla_grant_tenants",
			Help: "Tenant namespaces this provider holds for consumers it grants (as last ensured, removed or listed).",
		}),
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_tokens_issued_total",
			Help: "Tokens issued to consumers and checked to work against this API server.",
		}),
		fail: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_token_errors_total",
			Help: "Token issues that failed, including tokens the API server would not accept.",
		}),
	}
	return m, ctrl.Register(reg, m.tenants, m.issued, m.fail)
}
