package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The harness's kube-apiserver accepts DefaultAudience (--api-audiences),
// as a provider's must.
const (
	refusedAudience = "flotilla.io/not-accepted-here"
)

// Bad input is refused with an error that names it, before any request.
func TestEnsureRefusesBadInput(t *testing.T) {
	tenants, err := NewTenants(TenantsConfig{Config: &rest.Config{Host: "https://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	good := offloadtest.NewConsumer(t)
	for _, tc := range []struct {
		name     string
		consumer string
		limits   grant.Limits
		want     string
	}{
		{"consumer not a cluster ID", "Not-An-ID", grant.Limits{}, "cluster ID"},
		{"consumer a namespace path", "../kube-system", grant.Limits{}, "cluster ID"},
		{"CPU not a quantity", good, grant.Limits{CPU: "two"}, `CPU limit "two": not a Kubernetes quantity`},
		{"memory not a quantity", good, grant.Limits{Memory: "8 GB"}, `memory limit "8 GB": not a Kubernetes quantity`},
		{"CPU zero", good, grant.Limits{CPU: "0"}, `CPU limit "0": must be positive`},
		{"memory negative", good, grant.Limits{Memory: "-1Gi"}, `memory limit "-1Gi": must be positive`},
		{"pods negative", good, grant.Limits{Pods: -1}, "pods limit -1: must not be negative"},
		{"namespaces negative", good, grant.Limits{Namespaces: -2}, "namespaces limit -2: must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tenants.Ensure(t.Context(), tc.consumer, tc.limits)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Ensure(%q, %+v) = %v, want an error containing %q", tc.consumer, tc.limits, err, tc.want)
			}
		})
	}
}

// A cluster DNS Service without a namespace or a name, and a DNS address
// that is none, are refused, named.
func TestNewTenantsRefusesBadDNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  TenantsConfig
		want string
	}{
		{"Service without a namespace", TenantsConfig{DNSService: types.NamespacedName{Name: "kube-dns"}}, `cluster DNS Service "/kube-dns": want namespace/name`},
		{"Service without a name", TenantsConfig{DNSService: types.NamespacedName{Namespace: "kube-system"}}, `cluster DNS Service "kube-system/": want namespace/name`},
		{"no address", TenantsConfig{DNSAddresses: []netip.Addr{{}}}, "DNS address"},
		{"the unspecified address", TenantsConfig{DNSAddresses: []netip.Addr{netip.IPv4Unspecified()}}, `DNS address "0.0.0.0"`},
	} {
		tc.cfg.Config = &rest.Config{Host: "https://127.0.0.1:1"}
		if _, err := NewTenants(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestNewTenantsRefusesShortLifetime(t *testing.T) {
	_, err := NewTenants(TenantsConfig{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Lifetime: 5 * time.Minute})
	if err == nil || !strings.Contains(err.Error(), "refuses less than 10m0s") {
		t.Errorf("lifetime 5m: %v, want the API minimum named", err)
	}
}

// TestTenants runs everything against one real control plane; the
// subtests use consumers of their own.
func TestTenants(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	logs := &syncbuf.Buffer{}
	reg := prometheus.NewRegistry()
	tenants, err := NewTenants(TenantsConfig{
		Config: cp.Config, Client: cp.Client, Audience: offloadtest.AcceptedAudience,
		Logger:  slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	var issued tokenLog
	s := &suite{cp: cp, tenants: tenants, issued: &issued}

	t.Run("EnsureTwiceChangesNothing", s.testEnsureTwice)
	t.Run("LimitsChangeAndGo", s.testLimits)
	t.Run("PodWithoutRequestsFitsTheQuota", s.testDefaultRequests)
	t.Run("FenceOfATenant", s.testFence)
	t.Run("NewNamespacesWithoutReads", s.testWithoutReads)
	t.Run("FenceRefreshed", s.testFenceRefresh)
	t.Run("RestrictedWithoutThePolicies", s.testRestrictedWithoutPolicies)
	t.Run("ImmutableFieldsPutBack", s.testImmutablePutBack)
	t.Run("ForeignNamespaceRefused", s.testForeign)
	t.Run("TerminatingNamespace", s.testTerminating)
	t.Run("IssueRotateRevoke", s.testIssueRotateRevoke)
	t.Run("RevocationLatency", s.testRevocationLatency)
	t.Run("AudienceRefused", func(t *testing.T) { s.testAudienceRefused(t, logs) })
	t.Run("NoTokenInLogsOrMetrics", func(t *testing.T) {
		metrics, err := testutil.CollectAndFormat(reg, expfmt.TypeTextPlain)
		if err != nil {
			t.Fatal(err)
		}
		s.issued.check(t, "logs", logs.String())
		s.issued.check(t, "metrics", string(metrics))
		if n := s.issued.count(); n == 0 {
			t.Fatal("no token was issued: nothing was checked")
		}
		if got := testutil.ToFloat64(tenants.metrics.issued); got != float64(s.issued.count()) {
			t.Errorf("flotilla_grant_tokens_issued_total = %v, want %d", got, s.issued.count())
		}
	})
}

type suite struct {
	cp      *harness.ControlPlane
	tenants *Tenants
	issued  *tokenLog
}

// ensure is Ensure that must succeed.
func (s *suite) ensure(t *testing.T, consumer string, limits grant.Limits) Tenant {
	t.Helper()
	tenant, err := s.tenants.Ensure(t.Context(), consumer, limits)
	if err != nil {
		t.Fatalf("Ensure(%s, %+v): %v", consumer, limits, err)
	}
	return tenant
}

func (s *suite) issue(t *testing.T, consumer string) Token {
	t.Helper()
	tok, err := s.tenants.Issue(t.Context(), consumer)
	if err != nil {
		t.Fatalf("Issue(%s): %v", consumer, err)
	}
	s.issued.add(tok)
	return tok
}

// versions are the resourceVersions of everything in a tenant, by kind.
func (s *suite) versions(t *testing.T, consumer string) map[string]string {
	t.Helper()
	ctx, core, ns := t.Context(), s.cp.Client.CoreV1(), offload.TenantNamespace(consumer)
	out := map[string]string{}
	record := func(kind string, obj metav1.Object, err error) {
		if apierrors.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatalf("read %s of %s: %v", kind, consumer, err)
		}
		out[kind] = obj.GetResourceVersion()
	}
	n, err := core.Namespaces().Get(ctx, ns, metav1.GetOptions{})
	record("Namespace", n, err)
	sa, err := core.ServiceAccounts(ns).Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{})
	record("ServiceAccount", sa, err)
	sec, err := core.Secrets(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
	record("Secret", sec, err)
	rb, err := s.cp.Client.RbacV1().RoleBindings(ns).Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{})
	record("RoleBinding", rb, err)
	// The quota controller writes the quota's status whenever what the
	// namespace holds changes (its root CA ConfigMap, say): the quota's
	// version is what its other writers set.
	q, err := core.ResourceQuotas(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
	if err == nil {
		owned := slices.DeleteFunc(q.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Subresource == "status" })
		q.SetResourceVersion(fmt.Sprintf("labels %v annotations %v spec %v fields %v", q.Labels, q.Annotations, q.Spec, owned))
	}
	record("ResourceQuota", q, err)
	lr, err := core.LimitRanges(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
	record("LimitRange", lr, err)
	np, err := s.cp.Client.NetworkingV1().NetworkPolicies(ns).Get(ctx, FencePolicy, metav1.GetOptions{})
	record("NetworkPolicy", np, err)
	return out
}

// Everything of a tenant is there as the design names it, and a second
// Ensure writes nothing.
func (s *suite) testEnsureTwice(t *testing.T) {
	ctx, consumer := t.Context(), offloadtest.NewConsumer(t)
	limits := grant.Limits{CPU: "2", Memory: "4Gi", Pods: 10, Namespaces: 3}
	tenant := s.ensure(t, consumer, limits)
	ns := offload.TenantNamespace(consumer)
	if tenant != (Tenant{Consumer: consumer, Namespace: ns, Limits: limits}) {
		t.Errorf("Ensure returned %+v", tenant)
	}
	n, err := s.cp.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[offload.LabelTenant] != consumer || n.Labels["app.kubernetes.io/managed-by"] != "flotilla" {
		t.Errorf("namespace labels %v", n.Labels)
	}
	sec, err := s.cp.Client.CoreV1().Secrets(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Type != GrantSecretType || len(sec.Data) != 0 {
		t.Errorf("Secret type %q with %d keys, want %q and none", sec.Type, len(sec.Data), GrantSecretType)
	}
	rb, err := s.cp.Client.RbacV1().RoleBindings(ns).Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != offload.ConsumerClusterRole ||
		len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != offload.ConsumerServiceAccount || rb.Subjects[0].Namespace != ns {
		t.Errorf("RoleBinding %+v %+v", rb.RoleRef, rb.Subjects)
	}

	before := s.versions(t, consumer)
	if len(before) != 7 {
		t.Fatalf("tenant objects %v, want all seven", before)
	}
	s.ensure(t, consumer, limits)
	after := s.versions(t, consumer)
	for kind, was := range before {
		if after[kind] != was {
			t.Errorf("a second Ensure wrote the %s: version %s, was %s", kind, after[kind], was)
		}
	}
}

// The quota and the defaults follow the limits: the kinds set, and the
// object counts always (the defaults, or what the Peer raised them to);
// one patch per change.
func (s *suite) testLimits(t *testing.T) {
	consumer := offloadtest.NewConsumer(t)
	raised := grant.Fence{Services: 500, Secrets: 1000, ConfigMaps: 1000, EndpointSlices: 2000, PersistentVolumeClaims: 100, EphemeralStorage: "1Ti"}
	for _, step := range []struct {
		limits    grant.Limits
		quota     corev1.ResourceList
		defaults  corev1.ResourceList // nil: no LimitRange
		quotaSame bool                // the quota is not written
	}{
		{grant.Limits{}, counted(), nil, false},
		{grant.Limits{CPU: "2", Pods: 10},
			counted("requests.cpu", "2", "pods", "10"), rl("cpu", "100m"), false},
		{grant.Limits{CPU: "2", Pods: 10, Namespaces: 5}, // namespaces bound mirroring, not the quota
			counted("requests.cpu", "2", "pods", "10"), rl("cpu", "100m"), true},
		{grant.Limits{Memory: "1Gi"},
			counted("requests.memory", "1Gi"), rl("memory", "128Mi"), false},
		{grant.Limits{CPU: "50m", Memory: "64Mi"}, // defaults no larger than the limits
			counted("requests.cpu", "50m", "requests.memory", "64Mi"), rl("cpu", "50m", "memory", "64Mi"), false},
		{grant.Limits{Pods: 3}, counted("pods", "3"), nil, false},
		{grant.Limits{Pods: 3, Fence: raised}, rl("pods", "3", "services", "500", "secrets", "1000", "configmaps", "1000",
			"count/endpointslices.discovery.k8s.io", "2000", "persistentvolumeclaims", "100", "requests.ephemeral-storage", "1Ti"), nil, false},
		{grant.Limits{}, counted(), nil, false},
	} {
		before := s.versions(t, consumer)
		s.ensure(t, consumer, step.limits)
		after := s.versions(t, consumer)
		q, err := s.cp.Client.CoreV1().ResourceQuotas(offload.TenantNamespace(consumer)).Get(t.Context(), offload.GrantSecret, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Errorf("limits %+v: quota: %v", step.limits, err)
		case !sameResources(q.Spec.Hard, step.quota):
			t.Errorf("limits %+v: quota %v, want %v", step.limits, q.Spec.Hard, step.quota)
		}
		lr, err := s.cp.Client.CoreV1().LimitRanges(offload.TenantNamespace(consumer)).Get(t.Context(), offload.GrantSecret, metav1.GetOptions{})
		switch {
		case step.defaults == nil && !apierrors.IsNotFound(err):
			t.Errorf("limits %+v: LimitRange %+v (err %v), want none", step.limits, lr.Spec, err)
		case step.defaults != nil && err != nil:
			t.Errorf("limits %+v: LimitRange: %v", step.limits, err)
		case step.defaults != nil && (len(lr.Spec.Limits) != 1 || lr.Spec.Limits[0].Type != corev1.LimitTypeContainer ||
			!sameResources(lr.Spec.Limits[0].DefaultRequest, step.defaults) || len(lr.Spec.Limits[0].Default) != 0):
			t.Errorf("limits %+v: LimitRange %+v, want container default requests %v", step.limits, lr.Spec, step.defaults)
		}
		if step.quotaSame && after["ResourceQuota"] != before["ResourceQuota"] {
			t.Errorf("limits %+v: the quota was written though it did not change", step.limits)
		}
		for _, kind := range []string{"Namespace", "ServiceAccount", "Secret", "RoleBinding", "NetworkPolicy"} {
			if after[kind] != before[kind] && before[kind] != "" {
				t.Errorf("limits %+v: %s written (resourceVersion %s -> %s)", step.limits, kind, before[kind], after[kind])
			}
		}
	}
}

// In a tenant whose CPU and memory are limited, a pod that names no
// requests is admitted with the defaults rather than refused by the quota.
func (s *suite) testDefaultRequests(t *testing.T) {
	consumer := offloadtest.NewConsumer(t)
	s.ensure(t, consumer, grant.Limits{CPU: "1", Memory: "1Gi", Pods: 2})
	ns := offload.TenantNamespace(consumer)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "no-requests"},
		Spec:       *harness.Restricted(&corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}}),
	}
	// The quota admits pods only once its controller has computed usage.
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = s.cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Logf("create pod: %v", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("a pod without requests in a limited tenant: %v", err)
	}
	want := rl("cpu", DefaultCPURequest.String(), "memory", DefaultMemoryRequest.String())
	if req := got.Spec.Containers[0].Resources.Requests; !sameResources(req, want) {
		t.Errorf("requests %v, want the defaults %v", req, want)
	}
}

// A RoleBinding or Secret remade by someone else with another roleRef or
// type, fields an apply cannot change, is replaced by ours.
func (s *suite) testImmutablePutBack(t *testing.T) {
	ctx, consumer := t.Context(), offloadtest.NewConsumer(t)
	s.ensure(t, consumer, grant.Limits{})
	ns := offload.TenantNamespace(consumer)
	rbs, secrets := s.cp.Client.RbacV1().RoleBindings(ns), s.cp.Client.CoreV1().Secrets(ns)
	rb, err := rbs.Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rbs.Delete(ctx, rb.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rb = &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: rb.Name}, RoleRef: rb.RoleRef, Subjects: rb.Subjects}
	rb.RoleRef.Name = "admin"
	if _, err := rbs.Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := secrets.Delete(ctx, offload.GrantSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: offload.GrantSecret}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"k": []byte("v")}}
	if _, err := secrets.Create(ctx, opaque, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	s.ensure(t, consumer, grant.Limits{})
	if rb, err := rbs.Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{}); err != nil || rb.RoleRef.Name != offload.ConsumerClusterRole {
		t.Errorf("RoleBinding after Ensure: %+v, %v; want roleRef %s", rb.RoleRef, err, offload.ConsumerClusterRole)
	}
	if sec, err := secrets.Get(ctx, offload.GrantSecret, metav1.GetOptions{}); err != nil || sec.Type != GrantSecretType || len(sec.Data) != 0 {
		t.Errorf("Secret after Ensure: type %q, %d keys, %v; want %q and none", sec.Type, len(sec.Data), err, GrantSecretType)
	}
}

// A namespace named like a tenant but not ours, or another consumer's, is
// refused by every call and left exactly as it was.
func (s *suite) testForeign(t *testing.T) {
	ctx := t.Context()
	other := offloadtest.NewConsumer(t)
	for _, tc := range []struct {
		name   string
		labels map[string]string
	}{
		{"no labels", nil},
		{"our managed-by only", map[string]string{"app.kubernetes.io/managed-by": "flotilla"}},
		{"another consumer's", offload.TenantLabels(other)},
		{"tenant label, managed by someone else", map[string]string{"app.kubernetes.io/managed-by": "helm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			consumer := offloadtest.NewConsumer(t)
			if tc.name == "tenant label, managed by someone else" {
				tc.labels[offload.LabelTenant] = consumer
			}
			ns, err := s.cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
				ObjectMeta: metav1.ObjectMeta{Name: offload.TenantNamespace(consumer), Labels: tc.labels},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// Each call returns only after the writes it would have made.
			_, err = s.tenants.Ensure(ctx, consumer, grant.Limits{CPU: "1"})
			if !errors.Is(err, ErrForeignNamespace) || !strings.Contains(err.Error(), ns.Name) {
				t.Errorf("Ensure: %v, want ErrForeignNamespace naming %s", err, ns.Name)
			}
			if _, err := s.tenants.Issue(ctx, consumer); !errors.Is(err, ErrForeignNamespace) {
				t.Errorf("Issue: %v, want ErrForeignNamespace", err)
			}
			if err := s.tenants.Remove(ctx, consumer); !errors.Is(err, ErrForeignNamespace) {
				t.Errorf("Remove: %v, want ErrForeignNamespace", err)
			}
			if got := s.versions(t, consumer); len(got) != 1 || got["Namespace"] != ns.ResourceVersion {
				t.Errorf("after the calls: %v, want only the namespace at resourceVersion %s", got, ns.ResourceVersion)
			}
			list, err := s.tenants.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(list, consumer) {
				t.Errorf("List %v has the foreign namespace's %s", list, consumer)
			}
		})
	}
}

// A tenant still being deleted is reported as such, and neither fought
// nor recreated.
func (s *suite) testTerminating(t *testing.T) {
	ctx, consumer := t.Context(), offloadtest.NewConsumer(t)
	s.ensure(t, consumer, grant.Limits{})
	ns := offload.TenantNamespace(consumer)
	// A finalizer holds the namespace in Terminating.
	const finalizer = "flotilla.io/test-hold"
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hold", Finalizers: []string{finalizer}}}
	if _, err := s.cp.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		s.cp.Client.CoreV1().ConfigMaps(ns).Patch(context.Background(), "hold", "application/merge-patch+json", patch, metav1.PatchOptions{})
	})
	if err := s.tenants.Remove(ctx, consumer); err != nil {
		t.Fatal(err)
	}
	_, err := s.tenants.Ensure(ctx, consumer, grant.Limits{})
	if !errors.Is(err, ErrTerminating) {
		t.Errorf("Ensure of a terminating tenant: %v, want ErrTerminating", err)
	}
	if _, err := s.tenants.Issue(ctx, consumer); !errors.Is(err, ErrTerminating) {
		t.Errorf("Issue in a terminating tenant: %v, want ErrTerminating", err)
	}
	if err := s.tenants.Remove(ctx, consumer); err != nil {
		t.Errorf("Remove again: %v, want success", err)
	}
	if _, err := s.cp.Client.CoreV1().Secrets(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the grant Secret after Ensure in a terminating tenant: %v, want NotFound", err)
	}
}

// A token authenticates as the consumer for about its lifetime; a second
// one works beside it; Remove makes both fail and the tenant go.
func (s *suite) testIssueRotateRevoke(t *testing.T) {
	ctx, consumer := t.Context(), offloadtest.NewConsumer(t)
	s.ensure(t, consumer, grant.Limits{Pods: 5})
	start := time.Now()
	first := s.issue(t, consumer)
	end := time.Now()
	// Expiry is whole seconds: allow one either side.
	if lo, hi := start.Add(DefaultLifetime-time.Second), end.Add(DefaultLifetime+time.Second); first.Expires.Before(lo) || first.Expires.After(hi) {
		t.Errorf("expires %v, want within [%v, %v]", first.Expires, lo, hi)
	}
	if user, err := s.whoami(ctx, first); err != nil || user != offload.ConsumerUser(consumer) {
		t.Fatalf("first token: user %q, %v; want %q", user, err, offload.ConsumerUser(consumer))
	}
	second := s.issue(t, consumer)
	if second.Value.Equal(first.Value) {
		t.Fatal("the second token is the first")
	}
	for name, tok := range map[string]Token{"first": first, "second": second} {
		if user, err := s.whoami(ctx, tok); err != nil || user != offload.ConsumerUser(consumer) {
			t.Errorf("%s token after rotation: user %q, %v; want %q", name, user, err, offload.ConsumerUser(consumer))
		}
	}
	list, err := s.tenants.List(ctx)
	if err != nil || !slices.Contains(list, consumer) {
		t.Fatalf("List = %v, %v; want %s in it", list, err, consumer)
	}

	if err := s.tenants.Remove(ctx, consumer); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]Token{"first": first, "second": second} {
		if _, err := s.waitUnauthorized(ctx, tok); err != nil {
			t.Errorf("%s token after Remove: %v", name, err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := s.cp.Client.CoreV1().Namespaces().Get(ctx, offload.TenantNamespace(consumer), metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the tenant namespace after Remove: %v", err)
	}
	list, err = s.tenants.List(ctx)
	if err != nil || slices.Contains(list, consumer) {
		t.Errorf("List after Remove = %v, %v; want no %s", list, err, consumer)
	}
	if got := testutil.ToFloat64(s.tenants.metrics.tenants); got != float64(len(list)) {
		t.Errorf("flotilla_grant_tenants = %v after List found %d", got, len(list))
	}
	if err := s.tenants.Remove(ctx, consumer); err != nil {
		t.Errorf("Remove of a removed tenant: %v, want success", err)
	}
	if _, err := s.tenants.Issue(ctx, consumer); err == nil || !strings.Contains(err.Error(), "ensure the tenant first") {
		t.Errorf("Issue after Remove: %v, want the tenant missing", err)
	}
}

// How long after Remove returns a token used just before gets 401:
// kube-apiserver caches successful authentications (10 s), so a token in
// use keeps working that long; an idle one fails at once. Logged, not
// asserted.
func (s *suite) testRevocationLatency(t *testing.T) {
	const runs = 5
	var took []time.Duration
	for range runs {
		consumer := offloadtest.NewConsumer(t)
		s.ensure(t, consumer, grant.Limits{})
		tok := s.issue(t, consumer)
		if _, err := s.whoami(t.Context(), tok); err != nil { // as a consumer would have, just before
			t.Fatal(err)
		}
		if err := s.tenants.Remove(t.Context(), consumer); err != nil {
			t.Fatal(err)
		}
		d, err := s.waitUnauthorized(t.Context(), tok)
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, d)
	}
	slices.Sort(took)
	t.Logf("401 after Remove: median %v of %d runs (%v)", took[runs/2], runs, took)
}

// An API server that does not accept the audience refuses the token, and
// Issue says what to do.
func (s *suite) testAudienceRefused(t *testing.T, logs *syncbuf.Buffer) {
	consumer := offloadtest.NewConsumer(t)
	s.ensure(t, consumer, grant.Limits{})
	refusing, err := NewTenants(TenantsConfig{Config: s.cp.Config, Client: s.cp.Client, Audience: refusedAudience,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_, err = refusing.Issue(t.Context(), consumer)
	want := "the API server does not accept tokens for audience " + refusedAudience + ": add it to kube-apiserver --api-audiences"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Issue: %v, want %q", err, want)
	}
	if got := testutil.ToFloat64(refusing.metrics.fail); got != 1 {
		t.Errorf("flotilla_grant_token_errors_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(refusing.metrics.issued); got != 0 {
		t.Errorf("flotilla_grant_tokens_issued_total = %v, want 0", got)
	}
}

// whoami is the user the API server authenticates tok as.
func (s *suite) whoami(ctx context.Context, tok Token) (string, error) {
	cfg := rest.AnonymousClientConfig(s.cp.Config)
	cfg.BearerToken = tok.Value.Reveal()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return r.Status.UserInfo.Username, nil
}

// waitUnauthorized waits until tok gets 401 and says how long that took.
func (s *suite) waitUnauthorized(ctx context.Context, tok Token) (time.Duration, error) {
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = s.whoami(ctx, tok)
		return apierrors.IsUnauthorized(last), nil
	})
	if err != nil {
		return 0, fmt.Errorf("still not 401 (last: %v): %w", last, err)
	}
	return time.Since(start), nil
}

// tokenLog remembers every token issued, to look for them where they must
// not be.
type tokenLog struct {
	mu     sync.Mutex
	values []string
}

func (l *tokenLog) add(tok Token) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.values = append(l.values, tok.Value.Reveal())
}

func (l *tokenLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.values)
}

func (l *tokenLog) check(t *testing.T, where, text string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, v := range l.values {
		// The claims and the signature are what only this token has.
		for _, part := range strings.Split(v, ".")[1:] {
			if strings.Contains(text, part) {
				t.Errorf("token %d shows in the %s", i, where)
				break
			}
		}
	}
}

// counted is the quota of the kinds in pairs and the default object
// counts.
func counted(pairs ...string) corev1.ResourceList {
	return rl(append(pairs, "services", "100", "secrets", "200", "configmaps", "200",
		"count/endpointslices.discovery.k8s.io", "500", "persistentvolumeclaims", "20", "requests.ephemeral-storage", "50Gi")...)
}

// rl is a ResourceList from name, quantity pairs.
func rl(pairs ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(pairs); i += 2 {
		out[corev1.ResourceName(pairs[i])] = resource.MustParse(pairs[i+1])
	}
	return out
}

func sameResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}
