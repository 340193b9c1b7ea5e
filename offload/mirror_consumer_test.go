package offload

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/test/harness"
)

// matchesPattern compares s to p, where '?' in p stands for any character.
func matchesPattern(s, p string) bool {
	for i := range p {
		if p[i] != '?' && p[i] != s[i] {
			return false
		}
	}
	return true
}

// mirrorEnv is a consumer control plane and two providers, each with the
// CRDs and a real tenant for the consumer.
type mirrorEnv struct {
	local     *harness.ControlPlane
	lc        client.Client // admin of the consumer
	self      string
	creds     *testCredentials
	providers []*testProvider
	// shared is what the MirrorConsumers read NamespaceOffloads,
	// Namespaces and Peers from, as in the agent; it outlives each of
	// them (nil: each reads them itself).
	shared *SharedCache
}

type testProvider struct {
	id     string
	cp     *harness.ControlPlane
	admin  client.Client
	tenant string
}

// testCredentials hand out what each provider granted: a real token of
// its tenant (offload.Consumer does the same from sealed grants).
type testCredentials struct {
	mu sync.Mutex
	m  map[string]providerCredential
}

func (c *testCredentials) Credential(provider string) (*rest.Config, grant.Grant, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc, ok := c.m[provider]
	if !ok {
		return nil, grant.Grant{}, fmt.Errorf("no credential from %s: it has not granted offloading to this cluster", provider)
	}
	return rest.CopyConfig(pc.config), pc.grant, nil
}

func (c *testCredentials) set(provider string, pc providerCredential) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[provider] = pc
}

func (c *testCredentials) drop(provider string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, provider)
}

func newMirrorEnv(t *testing.T) *mirrorEnv {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cps := env.ControlPlanes(3, harness.ControlPlaneOptions{})
	e := &mirrorEnv{local: cps[0], self: newConsumer(t), creds: &testCredentials{m: map[string]providerCredential{}}}
	e.lc = adminClient(t, e.local)
	mustApplyCRDs(t, e.local.Config)
	e.shared = startSharedCache(t, e.local.Config, nil)
	for i, cp := range cps[1:] {
		mustApplyCRDs(t, cp.Config)
		p := &testProvider{id: newConsumer(t), cp: cp, admin: adminClient(t, cp)}
		e.grant(t, p)
		e.providers = append(e.providers, p)
		e.addPeer(t, p.id, fmt.Sprintf("p%d", i+1), map[string]string{"region": string(rune('a' + i))})
	}
	return e
}

// grant makes the consumer's tenant on p and a credential for it, as the
// provider's grant does; the ClusterRole has the namespacerequests rule
// the design gives the consumer.
func (e *mirrorEnv) grant(t *testing.T, p *testProvider) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ConsumerClusterRole},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"namespacerequests"},
			Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"},
		}},
	}
	if _, err := p.cp.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenants, err := NewTenants(TenantsConfig{Config: p.cp.Config, Client: p.cp.Client, Audience: acceptedAudience})
	if err != nil {
		t.Fatal(err)
	}
	e.creds.grantedBy(t, tenants, e.self, p, p.cp.Config.Host)
}

// grantedBy makes consumer's tenant on p with tenants and holds a token
// of it, to be used at server (p's API server, or a way to it), as a
// provider's grant hands one over.
func (c *testCredentials) grantedBy(t testing.TB, tenants *Tenants, consumer string, p *testProvider, server string) {
	t.Helper()
	tenant, err := tenants.Ensure(t.Context(), consumer, grant.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tenants.Issue(t.Context(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	p.tenant = tenant.Namespace
	c.set(p.id, providerCredential{
		config: &rest.Config{Host: server, BearerToken: tok.Value.Reveal(),
			TLSClientConfig: rest.TLSClientConfig{CAData: p.cp.Config.CAData}, Timeout: 10 * time.Second},
		grant: grant.Grant{Provider: p.id, Consumer: consumer, Serial: 1, Server: server,
			Namespace: tenant.Namespace, ExpiresAt: tok.Expires},
	})
}

// addPeer writes the consumer's Peer for a provider, granted (its
// OffloadCredential condition set, as offload.Consumer writes it).
func (e *mirrorEnv) addPeer(t testing.TB, id, name string, labels map[string]string) {
	t.Helper()
	peer := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: labels}}
	if err := e.lc.Create(t.Context(), peer); err != nil {
		t.Fatal(err)
	}
	peer.Status.ClusterName = name
	meta.SetStatusCondition(&peer.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionOffloadCredential, Status: metav1.ConditionTrue, Reason: "Ready", Message: "test"})
	if err := e.lc.Status().Update(t.Context(), peer); err != nil {
		t.Fatal(err)
	}
}

func (e *mirrorEnv) setLabels(t *testing.T, id string, labels map[string]string) {
	t.Helper()
	var peer v1alpha1.Peer
	if err := e.lc.Get(t.Context(), client.ObjectKey{Name: id}, &peer); err != nil {
		t.Fatal(err)
	}
	peer.Labels = labels
	if err := e.lc.Update(t.Context(), &peer); err != nil {
		t.Fatal(err)
	}
}

// start runs a MirrorConsumer until the returned stop is called (or the
// test ends).
func (e *mirrorEnv) start(t testing.TB) (stop func()) {
	t.Helper()
	mc, err := NewMirrorConsumer(MirrorConsumerConfig{
		Config: e.local.Config, Credentials: e.creds, Self: e.self, Peers: e.shared,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})), Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return runController(t, "MirrorConsumer.Run", mc.Run)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// offload creates namespace ns and a NamespaceOffload in it.
func (e *mirrorEnv) offload(t testing.TB, ns, name string, spec v1alpha1.NamespaceOffloadSpec) {
	t.Helper()
	err := e.lc.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := e.lc.Create(t.Context(), &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
}

// waitStatus waits until the NamespaceOffload ns/offload satisfies check.
func (e *mirrorEnv) waitStatus(t testing.TB, ns, what string, check func(o *v1alpha1.NamespaceOffload) error) *v1alpha1.NamespaceOffload {
	t.Helper()
	var o v1alpha1.NamespaceOffload
	eventually.Within(t, 30*time.Second, what, func() error {
		if err := e.lc.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "offload"}, &o); err != nil {
			return err
		}
		if err := check(&o); err != nil {
			return fmt.Errorf("%w; status %s", err, describeOffload(&o))
		}
		return nil
	})
	return &o
}

func describeOffload(o *v1alpha1.NamespaceOffload) string {
	s := fmt.Sprintf("phase %s gen %d/%d", o.Status.Phase, o.Status.ObservedGeneration, o.Generation)
	for _, c := range o.Status.Clusters {
		if r := meta.FindStatusCondition(c.Conditions, ConditionReady); r != nil {
			s += fmt.Sprintf("; %s(%s) %s %s: %s", c.ClusterName, c.RemoteNamespace, r.Status, r.Reason, r.Message)
		}
	}
	return s
}

// phaseIs checks the phase and, per cluster name, the Ready reason; no
// other cluster may be listed.
func phaseIs(phase v1alpha1.OffloadPhase, reasons map[string]string) func(*v1alpha1.NamespaceOffload) error {
	return func(o *v1alpha1.NamespaceOffload) error {
		if o.Status.Phase != phase || o.Status.ObservedGeneration != o.Generation {
			return errors.New("not yet")
		}
		if len(o.Status.Clusters) != len(reasons) {
			return errors.New("clusters differ")
		}
		for _, c := range o.Status.Clusters {
			r := meta.FindStatusCondition(c.Conditions, ConditionReady)
			if r == nil || reasons[c.ClusterName] != r.Reason {
				return errors.New("reasons differ")
			}
		}
		return nil
	}
}

// requests lists the requests mirroring ns on p.
func (p *testProvider) requests(t *testing.T, ns string) []v1alpha1.NamespaceRequest {
	t.Helper()
	var list v1alpha1.NamespaceRequestList
	if err := p.admin.List(t.Context(), &list, client.InNamespace(p.tenant), client.MatchingLabels{v1alpha1.LabelMirroredFrom: ns}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitRequest waits until p holds exactly one request for ns, named name.
func (p *testProvider) waitRequest(t *testing.T, ns, name string) v1alpha1.NamespaceRequest {
	t.Helper()
	var got v1alpha1.NamespaceRequest
	eventually.Within(t, 30*time.Second, "request for "+ns+" on "+p.id, func() error {
		rs := p.requests(t, ns)
		if len(rs) != 1 || rs[0].Name != name || rs[0].Spec.SourceNamespace != ns {
			return fmt.Errorf("requests %v", requestNames(rs))
		}
		got = rs[0]
		return nil
	})
	return got
}

func requestNames(rs []v1alpha1.NamespaceRequest) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name+"<-"+r.Spec.SourceNamespace)
	}
	return out
}

// answerAsProvider does, by hand, what the provider's agent does with a
// request (offload/mirror_provider*.go; the lead's e2e test runs the real
// one): Created makes the namespace and holds the request with its
// finalizer; Refused only answers.
func (p *testProvider) answerAsProvider(t *testing.T, name string, phase v1alpha1.RequestPhase, reason, message string) {
	t.Helper()
	ctx := t.Context()
	var r v1alpha1.NamespaceRequest
	if err := p.admin.Get(ctx, client.ObjectKey{Namespace: p.tenant, Name: name}, &r); err != nil {
		t.Fatal(err)
	}
	if phase == v1alpha1.RequestCreated {
		err := p.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			LabelTenant: strings.TrimPrefix(p.tenant, TenantPrefix), "app.kubernetes.io/managed-by": "flotilla",
			v1alpha1.LabelMirroredFrom: r.Spec.SourceNamespace}}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if controllerutil.AddFinalizer(&r, v1alpha1.FinalizerRequest) {
			if err := p.admin.Update(ctx, &r); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.Status = v1alpha1.NamespaceRequestStatus{Phase: phase, Reason: reason, Message: message, ObservedGeneration: r.Generation}
	if err := p.admin.Status().Update(ctx, &r); err != nil {
		t.Fatal(err)
	}
}

// releaseAsProvider is the provider's agent acting on a deleted request:
// the namespace goes, then the finalizer.
func (p *testProvider) releaseAsProvider(t *testing.T, name string) {
	t.Helper()
	ctx := t.Context()
	if err := p.admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	var r v1alpha1.NamespaceRequest
	if err := p.admin.Get(ctx, client.ObjectKey{Namespace: p.tenant, Name: name}, &r); err != nil {
		t.Fatal(err)
	}
	if r.DeletionTimestamp == nil {
		t.Fatalf("request %s on %s is not being deleted", name, p.id)
	}
	controllerutil.RemoveFinalizer(&r, v1alpha1.FinalizerRequest)
	if err := p.admin.Update(ctx, &r); err != nil {
		t.Fatal(err)
	}
}

func adminClient(t testing.TB, cp *harness.ControlPlane) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, corev1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// closedAddress is a loopback address nothing listens on.
func closedAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestMirrorConsumer runs the consumer's controller against a real
// consumer control plane and two real providers; the subtests run in
// order and use local namespaces of their own.
func TestMirrorConsumer(t *testing.T) {
	e := newMirrorEnv(t)
	p1, p2 := e.providers[0], e.providers[1]
	top := t // the controller outlives each subtest
	stop := e.start(top)

	t.Run("OnlyTheSelectedProvider", func(t *testing.T) {
		e.offload(t, "shop", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "a"}}})
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.self)
		r := p1.waitRequest(t, "shop", remote)
		if r.Labels[v1alpha1.LabelMirroredFrom] != "shop" {
			t.Errorf("request labels %v", r.Labels)
		}
		// The status is written in the pass that wrote p1's request and
		// looked at p2: by then p2 would have its own.
		o := e.waitStatus(t, "shop", "p1 pending", phaseIs(v1alpha1.OffloadInProgress, map[string]string{"p1": ReasonPending}))
		if !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerOffload) {
			t.Errorf("finalizers %v", o.Finalizers)
		}
		if rs := p2.requests(t, "shop"); len(rs) != 0 {
			t.Errorf("p2, not selected, has requests %v", requestNames(rs))
		}
		// Ready comes from the provider's answer through the watch: the
		// controller has no resync or polling interval.
		p1.answerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		o = e.waitStatus(t, "shop", "Ready", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		if o.Status.Clusters[0].RemoteNamespace != remote || o.Status.Clusters[0].ClusterID != p1.id {
			t.Errorf("cluster status %+v", o.Status.Clusters[0])
		}
		// The placement webhook's namespaceSelector.
		e.waitOffloadedLabel(t, "shop", true)
	})

	t.Run("OffloadedLabelIsOurs", func(t *testing.T) {
		// Taken off by hand, it comes back while the namespace is
		// offloaded; put on a namespace that is not, it goes.
		e.removeOffloadedLabel(t, "shop")
		e.waitOffloadedLabel(t, "shop", true)
		if err := e.lc.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain", Labels: map[string]string{LabelOffloaded: "true"}}}); err != nil {
			t.Fatal(err)
		}
		e.waitOffloadedLabel(t, "plain", false)
	})

	t.Run("RefusalsShowTheirReason", func(t *testing.T) {
		// No selector: every provider that granted this cluster.
		e.offload(t, "refused", "offload", v1alpha1.NamespaceOffloadSpec{NamespaceMapping: v1alpha1.MappingSameName})
		p1.waitRequest(t, "refused", "refused")
		p2.waitRequest(t, "refused", "refused")
		p1.answerAsProvider(t, "refused", v1alpha1.RequestCreated, "Created", "")
		p2.answerAsProvider(t, "refused", v1alpha1.RequestRefused, "OverLimit", "the grant allows 0 more namespaces")
		o := e.waitStatus(t, "refused", "SomeFailed", phaseIs(v1alpha1.OffloadSomeFailed, map[string]string{"p1": "Created", "p2": "OverLimit"}))
		for _, c := range o.Status.Clusters {
			if r := meta.FindStatusCondition(c.Conditions, ConditionReady); c.ClusterName == "p2" && r.Message != "the grant allows 0 more namespaces" {
				t.Errorf("p2's message %q, want the provider's", r.Message)
			}
		}
		p1.answerAsProvider(t, "refused", v1alpha1.RequestRefused, "AlreadyExists", "namespace refused exists and is not yours")
		e.waitStatus(t, "refused", "AllFailed", phaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": "AlreadyExists", "p2": "OverLimit"}))
	})

	t.Run("ProviderNoLongerSelected", func(t *testing.T) {
		e.setLabels(t, p2.id, map[string]string{"region": "a"})
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.self)
		p2.waitRequest(t, "shop", remote)
		e.waitStatus(t, "shop", "p2 selected", phaseIs(v1alpha1.OffloadInProgress, map[string]string{"p1": "Created", "p2": ReasonPending}))
		e.setLabels(t, p2.id, map[string]string{"region": "b"})
		eventually.Within(t, 30*time.Second, "p2's request deleted", func() error {
			if rs := p2.requests(t, "shop"); len(rs) != 0 {
				return fmt.Errorf("requests %v", requestNames(rs))
			}
			return nil
		})
		e.waitStatus(t, "shop", "p1 alone", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		p1.waitRequest(t, "shop", remote)
	})

	t.Run("UnreachableProvider", func(t *testing.T) {
		far := newConsumer(t)
		addr := closedAddress(t)
		e.creds.set(far, providerCredential{
			config: &rest.Config{Host: "https://" + addr, BearerToken: "none", Timeout: 2 * time.Second},
			grant:  grant.Grant{Provider: far, Consumer: e.self, Serial: 1, Server: "https://" + addr, Namespace: TenantNamespace(e.self)},
		})
		e.addPeer(t, far, "far", map[string]string{"region": "far"})
		e.offload(t, "far", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "far"}}})
		o := e.waitStatus(t, "far", "Unreachable", phaseIs(v1alpha1.OffloadAllFailed, map[string]string{"far": ReasonUnreachable}))
		if r := meta.FindStatusCondition(o.Status.Clusters[0].Conditions, ConditionReady); !strings.Contains(r.Message, addr) {
			t.Errorf("message %q does not name the API server %s", r.Message, addr)
		}
		// Deleting waits for the unreachable provider, until it no longer
		// grants: revoking removed everything there.
		if err := e.lc.Delete(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		e.waitStatus(t, "far", "Terminating", phaseIs(v1alpha1.OffloadTerminating, map[string]string{"far": ReasonUnreachable}))
		e.creds.drop(far)
		if err := e.lc.Delete(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: far}}); err != nil {
			t.Fatal(err)
		}
		e.waitGone(t, "far")
	})

	t.Run("DeletionRemovesRemoteNamespacesFirst", func(t *testing.T) {
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.self)
		if err := e.lc.Delete(t.Context(), &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "offload"}}); err != nil {
			t.Fatal(err)
		}
		e.waitStatus(t, "shop", "Terminating", phaseIs(v1alpha1.OffloadTerminating, map[string]string{"p1": ReasonDeleting}))
		// The label went before the status said Terminating: no pod
		// created from then on is sent to a provider.
		if v, ok := e.namespaceLabels(t, "shop")[LabelOffloaded]; ok {
			t.Errorf("namespace shop still labelled %s=%s while its offload terminates", LabelOffloaded, v)
		}
		// The request is deleted and held by the provider's finalizer; the
		// NamespaceOffload waits for it.
		eventually.Within(t, 30*time.Second, "request deleted", func() error {
			rs := p1.requests(t, "shop")
			if len(rs) != 1 || rs[0].DeletionTimestamp == nil {
				return fmt.Errorf("requests %v", requestNames(rs))
			}
			return nil
		})
		p1.releaseAsProvider(t, remote)
		e.waitGone(t, "shop")
		if rs := p1.requests(t, "shop"); len(rs) != 0 {
			t.Errorf("requests left %v", requestNames(rs))
		}
	})

	t.Run("RestartConverges", func(t *testing.T) {
		e.offload(t, "again", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "a"}}})
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "again", "", e.self)
		before := p1.waitRequest(t, "again", remote)
		p1.answerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		e.waitStatus(t, "again", "Ready", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		stop()
		// While it is down, p2 comes to match.
		e.setLabels(t, p2.id, map[string]string{"region": "a"})
		stop = e.start(top)
		p2.waitRequest(t, "again", remote)
		p2.answerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		e.waitStatus(t, "again", "Ready on both", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created", "p2": "Created"}))
		after := p1.waitRequest(t, "again", remote)
		if after.UID != before.UID {
			t.Errorf("p1's request was recreated (uid %s, was %s)", after.UID, before.UID)
		}
	})
	t.Run("SecondOffloadInANamespaceIsIgnored", func(t *testing.T) {
		e.offload(t, "again", "second", v1alpha1.NamespaceOffloadSpec{NamespaceMapping: v1alpha1.MappingSameName})
		eventually.Within(t, 30*time.Second, "the second says it is ignored", func() error {
			var o v1alpha1.NamespaceOffload
			if err := e.lc.Get(t.Context(), client.ObjectKey{Namespace: "again", Name: "second"}, &o); err != nil {
				return err
			}
			if err := phaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": ReasonDuplicate, "p2": ReasonDuplicate})(&o); err != nil {
				return fmt.Errorf("%w: %s", err, describeOffload(&o))
			}
			if r := meta.FindStatusCondition(o.Status.Clusters[0].Conditions, ConditionReady); !strings.Contains(r.Message, "NamespaceOffload offload") {
				return fmt.Errorf("message %q does not name the one acting", r.Message)
			}
			if len(o.Finalizers) != 0 {
				return fmt.Errorf("finalizers %v", o.Finalizers)
			}
			return nil
		})
		// Its status was written in the pass that kept the first's
		// requests: still one per provider, under the first's name.
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "again", "", e.self)
		p1.waitRequest(t, "again", remote)
		p2.waitRequest(t, "again", remote)
	})
}

func (e *mirrorEnv) namespaceLabels(t *testing.T, ns string) map[string]string {
	t.Helper()
	var n corev1.Namespace
	if err := e.lc.Get(t.Context(), client.ObjectKey{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

// waitOffloadedLabel waits until namespace ns carries LabelOffloaded=true,
// or carries no LabelOffloaded.
func (e *mirrorEnv) waitOffloadedLabel(t *testing.T, ns string, offloaded bool) {
	t.Helper()
	eventually.Within(t, 30*time.Second, fmt.Sprintf("namespace %s offloaded=%v", ns, offloaded), func() error {
		v, ok := e.namespaceLabels(t, ns)[LabelOffloaded]
		if (offloaded && v != "true") || (!offloaded && ok) {
			return fmt.Errorf("label %s=%q (present %v)", LabelOffloaded, v, ok)
		}
		return nil
	})
}

// removeOffloadedLabel takes LabelOffloaded off namespace ns, as a user
// could.
func (e *mirrorEnv) removeOffloadedLabel(t *testing.T, ns string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, LabelOffloaded)
	if err := e.lc.Patch(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// waitGone waits until ns/offload no longer exists.
func (e *mirrorEnv) waitGone(t *testing.T, ns string) {
	t.Helper()
	eventually.Within(t, 30*time.Second, "NamespaceOffload in "+ns+" gone", func() error {
		var o v1alpha1.NamespaceOffload
		err := e.lc.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "offload"}, &o)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: %s, finalizers %v", describeOffload(&o), o.Finalizers)
	})
}

// The consumer's clients of a provider never hold a request back on
// their side (client-go's default is 5 a second, bursts of 10): a
// hundred namespaces offloaded at once are a hundred requests there.
func TestCredentialConfigDoesNotThrottle(t *testing.T) {
	cs, err := kubernetes.NewForConfig(restConfigOf(grant.Grant{Server: "https://127.0.0.1:6443"}))
	if err != nil {
		t.Fatal(err)
	}
	l := cs.CoreV1().RESTClient().GetRateLimiter()
	if l == nil {
		return
	}
	for i := range 500 {
		if !l.TryAccept() {
			t.Fatalf("the client of a provider holds request %d back (client-side rate limit %v a second)", i+1, l.QPS())
		}
	}
}
