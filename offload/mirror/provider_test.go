package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// mirrorSuite is one control plane with deploy/'s RBAC and admission, and
// the mirroring controller running as the agent, with the agent's token.
type mirrorSuite struct {
	cp      *harness.ControlPlane
	admin   client.Client
	tenants *tenancy.Tenants
	grants  *offloadtest.Grants
	cfg     ProviderConfig
	top     *testing.T // the controller's lifetime
	first   *Provider  // the first controller and the last
	last    *Provider
	stop    func() // stops the running controller
}

// TestMirrorProvider runs the provider's side of namespace mirroring
// against one real control plane; each subtest has consumers of its own,
// which write their requests with their own tokens.
func TestMirrorProvider(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	offloadtest.MustApplyCRDs(t, cp.Config)
	offloadtest.InstallProvider(t, cp)
	agent := offloadtest.ServiceAccountConfig(t, cp, "flotilla-system", "flotilla-agent")
	// The addresses fences are made of are read again after a second:
	// FenceFollowsTheNodes waits for that.
	tenants, err := tenancy.NewTenants(tenancy.TenantsConfig{Config: agent, Audience: offloadtest.AcceptedAudience, FenceRefresh: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cp.Config, client.Options{Scheme: providerTestScheme(t), Mapper: offload.MirrorMapper()})
	if err != nil {
		t.Fatal(err)
	}
	s := &mirrorSuite{cp: cp, admin: admin, tenants: tenants, grants: &offloadtest.Grants{Limits: map[string]grant.Limits{}}, top: t}
	s.cfg = ProviderConfig{
		Config: agent, Tenants: tenants, Grants: s.grants, AgentNamespace: "flotilla-system",
		Resync: time.Second, Shared: offloadtest.StartSharedCache(t, agent, nil), Logger: slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, nil)),
	}
	s.start()

	t.Run("RequestBecomesNamespace", s.testCreated)
	t.Run("ReservedAndCraftedNamesRefused", s.testRefused)
	t.Run("NamespaceSquatRefused", s.testSquat)
	t.Run("FencePutBack", s.testFencePutBack)
	t.Run("FenceFollowsTheNodes", s.testFenceFollowsTheNodes)
	t.Run("NotGranted", s.testNotGranted)
	t.Run("OverLimit", s.testOverLimit)
	t.Run("ForeignNamespaceUntouched", s.testAlreadyExists)
	t.Run("DeletingTheRequestDeletesTheNamespace", s.testDelete)
	t.Run("NamespaceWithoutRequestCollected", s.testGarbage)
	t.Run("RevocationRemovesMirrored", s.testRevoke)
	t.Run("RestartConverges", s.testRestart)
	t.Run("Metrics", func(t *testing.T) {
		m := s.first.m
		for _, reason := range []string{ReasonCreated, ReasonReserved, ReasonInvalidName, ReasonAlreadyExists, ReasonOverLimit, ReasonNotGranted, ReasonNotSuffixed} {
			if got := testutil.ToFloat64(m.requests.WithLabelValues(reason)); got == 0 {
				t.Errorf("flotilla_mirror_requests_total{result=%q} = 0", reason)
			}
		}

	})
}

// start runs a new controller until stop or the test's end.
func (s *mirrorSuite) start() {
	t := s.top
	cfg := s.cfg
	cfg.Metrics = prometheus.NewRegistry()
	m, err := NewProvider(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.first == nil {
		s.first = m
	}
	s.last = m
	s.stop = offloadtest.RunUntilCleanup(t, "mirror.Provider.Run", m.Run)
}

func providerTestScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := errors.Join(v1alpha1.AddToScheme(scheme), corev1.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// consumerOf is a granted consumer with its tenant, and a client with the
// token issued to it.
type consumerOf struct {
	id     string
	tenant string
	client client.Client
	kube   kubernetes.Interface
}

func (s *mirrorSuite) newConsumer(t *testing.T, limits grant.Limits) consumerOf {
	t.Helper()
	id := offloadtest.NewConsumer(t)
	tenant, err := s.tenants.Ensure(t.Context(), id, limits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.tenants.Remove(context.Background(), id); err != nil {
			t.Errorf("remove tenant %s: %v", id, err)
		}
	})
	tok, err := s.tenants.Issue(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(s.cp.Config)
	cfg.BearerToken = tok.Value.Reveal()
	c, err := client.New(cfg, client.Options{Scheme: providerTestScheme(t), Mapper: offload.MirrorMapper()})
	if err != nil {
		t.Fatal(err)
	}
	s.grants.Set(id, limits)
	return consumerOf{id: id, tenant: tenant.Namespace, client: c, kube: kubernetes.NewForConfigOrDie(cfg)}
}

// request writes a NamespaceRequest with the consumer's own token.
func (c consumerOf) request(t *testing.T, name, source string) *v1alpha1.NamespaceRequest {
	t.Helper()
	r := &v1alpha1.NamespaceRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.tenant},
		Spec:       v1alpha1.NamespaceRequestSpec{SourceNamespace: source},
	}
	if len(validation.IsValidLabelValue(source)) == 0 {
		r.Labels = map[string]string{v1alpha1.LabelMirroredFrom: source}
	}
	if err := c.client.Create(t.Context(), r); err != nil {
		t.Fatalf("the consumer requests %s: %v", name, err)
	}
	return r
}

// waitStatus waits until the request says reason, and returns it.
func (s *mirrorSuite) waitStatus(t *testing.T, c consumerOf, name, reason string) *v1alpha1.NamespaceRequest {
	t.Helper()
	var got v1alpha1.NamespaceRequest
	eventually.Within(t, 60*time.Second, "request "+name+" "+reason, func() error {
		if err := c.client.Get(t.Context(), client.ObjectKey{Namespace: c.tenant, Name: name}, &got); err != nil {
			return err
		}
		if got.Status.Reason != reason || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("status %+v (generation %d)", got.Status, got.Generation)
		}
		return nil
	})
	return &got
}

func (s *mirrorSuite) namespace(t *testing.T, name string) (*corev1.Namespace, bool) {
	t.Helper()
	ns, err := s.cp.Client.CoreV1().Namespaces().Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return ns, true
}

func (s *mirrorSuite) waitGone(t *testing.T, name string) {
	t.Helper()
	eventually.Within(t, 120*time.Second, "namespace "+name+" gone", func() error {
		if ns, ok := s.namespace(t, name); ok {
			return fmt.Errorf("namespace %s still there (deleting: %v)", name, ns.DeletionTimestamp != nil)
		}
		return nil
	})
}

func remoteName(t *testing.T, local, consumer string) string {
	t.Helper()
	name, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, local, "", consumer)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// A request becomes a namespace labelled as the consumer's, with its
// RoleBinding and the grant's quota; the consumer's token runs a pod there.
func (s *mirrorSuite) testCreated(t *testing.T) {
	ctx := t.Context()
	c := s.newConsumer(t, grant.Limits{CPU: "2", Pods: 5, Namespaces: 3})
	name := remoteName(t, "shop", c.id)
	c.request(t, name, "shop")
	r := s.waitStatus(t, c, name, ReasonCreated)
	if r.Status.Phase != v1alpha1.RequestCreated || !slices.Contains(r.Finalizers, v1alpha1.FinalizerRequest) {
		t.Errorf("request %+v, finalizers %v: want Created with %s", r.Status, r.Finalizers, v1alpha1.FinalizerRequest)
	}
	ns, ok := s.namespace(t, name)
	if !ok {
		t.Fatalf("namespace %s does not exist", name)
	}
	for k, v := range offload.MirroredLabels(c.id, "shop") {
		if ns.Labels[k] != v {
			t.Errorf("namespace %s label %s=%q, want %q", name, k, ns.Labels[k], v)
		}
	}
	rb, err := s.cp.Client.RbacV1().RoleBindings(name).Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("RoleBinding: %v", err)
	}
	if rb.RoleRef.Name != offload.ConsumerClusterRole || len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != c.tenant || rb.Subjects[0].Name != offload.ConsumerServiceAccount {
		t.Errorf("RoleBinding %+v %+v", rb.RoleRef, rb.Subjects)
	}
	q, err := s.cp.Client.CoreV1().ResourceQuotas(name).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ResourceQuota: %v", err)
	}
	if got := q.Spec.Hard[corev1.ResourceRequestsCPU]; got.String() != "2" {
		t.Errorf("quota requests.cpu = %s, want 2", got.String())
	}
	if _, err := s.cp.Client.CoreV1().LimitRanges(name).Get(ctx, offload.GrantSecret, metav1.GetOptions{}); err != nil {
		t.Errorf("LimitRange: %v", err)
	}
	// The default ServiceAccount comes from kube-controller-manager.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"}, Spec: *harness.Restricted(&corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}})}
	eventually.Within(t, 60*time.Second, "the consumer creates a pod in "+name, func() error {
		_, err := c.kube.CoreV1().Pods(name).Create(ctx, pod, metav1.CreateOptions{})
		return err
	})
	// The consumer may not answer its own request.
	patch := client.MergeFrom(r.DeepCopy())
	r.Status.Reason = ReasonOverLimit
	if err := c.client.Status().Patch(ctx, r, patch); !apierrors.IsForbidden(err) {
		t.Errorf("the consumer writes its request's status: %v, want Forbidden", err)
	}
}

// With its own token a consumer may not take a name this cluster's own
// workloads may want: after its suffixed request becomes a namespace (the
// witness that requests are answered), monitoring and argocd are refused
// and not made, as is creating the namespace itself; once the provider's
// admin allows any name, argocd is made.
func (s *mirrorSuite) testSquat(t *testing.T) {
	c := s.newConsumer(t, grant.Limits{})
	witness := remoteName(t, "shop", c.id)
	c.request(t, witness, "shop")
	s.waitStatus(t, c, witness, ReasonCreated)
	if _, ok := s.namespace(t, witness); !ok {
		t.Fatalf("namespace %s of the witness request does not exist", witness)
	}
	for _, name := range []string{"monitoring", "argocd"} {
		c.request(t, name, name)
		r := s.waitStatus(t, c, name, ReasonNotSuffixed)
		t.Logf("request %s: %s %s: %s", name, r.Status.Phase, r.Status.Reason, r.Status.Message)
		if r.Status.Phase != v1alpha1.RequestRefused || !strings.Contains(r.Status.Message, "-"+offload.ClusterSuffix(c.id)) {
			t.Errorf("request %s: %+v, want Refused naming the suffix", name, r.Status)
		}
		if _, ok := s.namespace(t, name); ok {
			t.Errorf("namespace %s was made for a request without the consumer's suffix", name)
		}
	}
	_, err := c.kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("the consumer creates namespace monitoring itself: %v, want Forbidden", err)
	}
	t.Logf("the consumer creates namespace monitoring: %d %v", err.(apierrors.APIStatus).Status().Code, err)

	s.grants.Set(c.id, grant.Limits{Fence: grant.Fence{AnyNamespaceName: true}})
	s.waitStatus(t, c, "argocd", ReasonCreated)
	if ns, ok := s.namespace(t, "argocd"); !ok || !tenancy.MirroredFor(ns, c.id, "argocd") {
		t.Errorf("namespace argocd, allowed any name: %v, %v", ok, ns)
	}
}

// The NetworkPolicy of the consumer's namespaces, its tenant namespace
// and one mirrored, deleted or opened up by someone, is put back.
func (s *mirrorSuite) testFencePutBack(t *testing.T) {
	ctx := t.Context()
	c := s.newConsumer(t, grant.Limits{})
	name := remoteName(t, "fenced", c.id)
	c.request(t, name, "fenced")
	s.waitStatus(t, c, name, ReasonCreated)
	for _, ns := range []string{c.tenant, name} {
		policies := s.cp.Client.NetworkingV1().NetworkPolicies(ns)
		fenced := func(what string) {
			t.Helper()
			eventually.Within(t, 30*time.Second, "the fence of "+ns+" "+what, func() error {
				p, err := policies.Get(ctx, tenancy.FencePolicy, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if len(p.Spec.Egress) != 3 || len(p.Spec.Egress[2].To) != 2 || p.Spec.Egress[2].To[0].IPBlock == nil ||
					!slices.Contains(p.Spec.Egress[2].To[0].IPBlock.Except, tenancy.MetadataNetwork.String()) {
					return fmt.Errorf("egress %+v", p.Spec.Egress)
				}
				return nil
			})
		}
		fenced("in place")
		if err := policies.Delete(ctx, tenancy.FencePolicy, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		fenced("back after a delete")
		if _, err := policies.Patch(ctx, tenancy.FencePolicy, types.MergePatchType, []byte(`{"spec":{"egress":[{}]}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		fenced("back after it was opened up")
	}
}

// A node that joins after a namespace was mirrored is denied by its fence
// too, and a cluster DNS endpoint that appears at a node's address is
// allowed on port 53 there, without anyone touching the fence: the
// provider rewrites the fences whose addresses changed.
func (s *mirrorSuite) testFenceFollowsTheNodes(t *testing.T) {
	ctx := t.Context()
	c := s.newConsumer(t, grant.Limits{})
	name := remoteName(t, "follows", c.id)
	c.request(t, name, "follows")
	s.waitStatus(t, c, name, ReasonCreated)
	policies := s.cp.Client.NetworkingV1().NetworkPolicies(name)
	first, err := policies.Get(ctx, tenancy.FencePolicy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const addr = "192.0.2.201"
	if slices.ContainsFunc(first.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool { return peersName(r.To, addr+"/32") }) {
		t.Fatalf("the fence names %s before any node has it: %+v", addr, first.Spec.Egress)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "follows-" + c.id[:8]}}
	if _, err := s.cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cp.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
	if _, err := s.cp.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dns := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kube-dns-" + c.id[:8], Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
	}
	if _, err := s.cp.Client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, dns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.cp.Client.DiscoveryV1().EndpointSlices("kube-system").Delete(context.Background(), dns.Name, metav1.DeleteOptions{})
	})
	eventually.Within(t, 30*time.Second, "the fence of "+name+" denies the node "+addr+" but its port 53", func() error {
		p, err := policies.Get(ctx, tenancy.FencePolicy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		last := p.Spec.Egress[len(p.Spec.Egress)-1]
		if len(last.To) == 0 || last.To[0].IPBlock == nil || !slices.Contains(last.To[0].IPBlock.Except, addr+"/32") {
			return fmt.Errorf("the last rule does not except %s: %+v", addr, last)
		}
		if !peersName(p.Spec.Egress[0].To, addr+"/32") {
			return fmt.Errorf("the DNS rule does not name %s: %+v", addr, p.Spec.Egress[0])
		}
		return nil
	})
}

// peersName says whether peers hold an ipBlock of cidr.
func peersName(peers []networkingv1.NetworkPolicyPeer, cidr string) bool {
	return slices.ContainsFunc(peers, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil && p.IPBlock.CIDR == cidr })
}

// Reserved and crafted names are refused with the reason, and nothing is
// created; names the API server itself refuses never reach us.
func (s *mirrorSuite) testRefused(t *testing.T) {
	c := s.newConsumer(t, grant.Limits{})
	for _, tc := range []struct{ name, source, reason string }{
		{"kube-system", "shop", ReasonReserved},
		{"kube-foo", "shop", ReasonReserved},
		{"default", "shop", ReasonReserved},
		{"flotilla-system", "shop", ReasonReserved},
		{"flotilla-tenant-" + c.id[:10], "shop", ReasonReserved},
		{"openshift-x", "shop", ReasonReserved},
		{strings.Repeat("a", 64), "shop", ReasonInvalidName},
		{"a.b", "shop", ReasonInvalidName},
		{"fine-name", "../x", ReasonInvalidName},
		{"fine-name2", "Shop", ReasonInvalidName},
	} {
		t.Run(tc.name+" from "+tc.source, func(t *testing.T) {
			c.request(t, tc.name, tc.source)
			r := s.waitStatus(t, c, tc.name, tc.reason)
			if r.Status.Phase != v1alpha1.RequestRefused || r.Status.Message == "" || slices.Contains(r.Finalizers, v1alpha1.FinalizerRequest) {
				t.Errorf("request %s: %+v, finalizers %v; want Refused with a message and no finalizer", tc.name, r.Status, r.Finalizers)
			}
			if ns, ok := s.namespace(t, tc.name); ok && ns.Labels[offload.LabelTenant] == c.id {
				t.Errorf("namespace %s was made for %s", tc.name, c.id)
			}
		})
	}
	for _, name := range []string{"Shop", "../x"} {
		r := &v1alpha1.NamespaceRequest{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.tenant}, Spec: v1alpha1.NamespaceRequestSpec{SourceNamespace: "shop"}}
		if err := c.client.Create(t.Context(), r); err == nil {
			t.Errorf("the API server took a request named %q", name)
		}
	}
}

func (s *mirrorSuite) testNotGranted(t *testing.T) {
	c := s.newConsumer(t, grant.Limits{})
	s.grants.Mu.Lock()
	delete(s.grants.Limits, c.id)
	s.grants.Mu.Unlock()
	name := remoteName(t, "shop", c.id)
	c.request(t, name, "shop")
	s.waitStatus(t, c, name, ReasonNotGranted)
	if _, ok := s.namespace(t, name); ok {
		t.Errorf("namespace %s made for a consumer not granted", name)
	}
	// Granted later (a restart's first reconcile): the resync picks it up.
	s.grants.Set(c.id, grant.Limits{})
	s.waitStatus(t, c, name, ReasonCreated)
}

// Beyond the grant's namespace count: refused, and the ones made stay.
func (s *mirrorSuite) testOverLimit(t *testing.T) {
	c := s.newConsumer(t, grant.Limits{Namespaces: 1})
	first, second := remoteName(t, "a", c.id), remoteName(t, "b", c.id)
	c.request(t, first, "a")
	s.waitStatus(t, c, first, ReasonCreated)
	c.request(t, second, "b")
	r := s.waitStatus(t, c, second, ReasonOverLimit)
	if !strings.Contains(r.Status.Message, "(1)") {
		t.Errorf("OverLimit message %q does not name the limit", r.Status.Message)
	}
	if _, ok := s.namespace(t, second); ok {
		t.Errorf("namespace %s made beyond the limit", second)
	}
	// A higher limit lets it in.
	s.grants.Set(c.id, grant.Limits{Namespaces: 2})
	s.waitStatus(t, c, second, ReasonCreated)
	s.waitStatus(t, c, first, ReasonCreated)
}

// A namespace that exists and is not ours for that consumer and source is
// refused as AlreadyExists and never touched.
func (s *mirrorSuite) testAlreadyExists(t *testing.T) {
	ctx := t.Context()
	c, other := s.newConsumer(t, grant.Limits{}), s.newConsumer(t, grant.Limits{})
	foreign := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "payments-" + c.id[1:7], Labels: map[string]string{"team": "payments"}}}
	foreign, err := s.cp.Client.CoreV1().Namespaces().Create(ctx, foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.cp.Client.CoreV1().Namespaces().Delete(context.Background(), foreign.Name, metav1.DeleteOptions{})
	})
	theirs := remoteName(t, "shop", other.id)
	other.request(t, theirs, "shop")
	s.waitStatus(t, other, theirs, ReasonCreated)
	before, _ := s.namespace(t, theirs)

	c.request(t, foreign.Name, "payments")
	c.request(t, theirs, "shop") // the other consumer's
	s.waitStatus(t, c, foreign.Name, ReasonAlreadyExists)
	s.waitStatus(t, c, theirs, ReasonAlreadyExists)
	for _, want := range []*corev1.Namespace{foreign, before} {
		got, ok := s.namespace(t, want.Name)
		if !ok || got.ResourceVersion != want.ResourceVersion || got.DeletionTimestamp != nil {
			t.Errorf("namespace %s was touched: %+v", want.Name, got)
		}
	}
	if _, err := s.cp.Client.RbacV1().RoleBindings(foreign.Name).Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("RoleBinding in the foreign namespace: %v", err)
	}
	// Deleting the refused request leaves the other's namespace be.
	if err := c.client.Delete(ctx, &v1alpha1.NamespaceRequest{ObjectMeta: metav1.ObjectMeta{Name: theirs, Namespace: c.tenant}}); err != nil {
		t.Fatal(err)
	}
	s.waitStatus(t, other, theirs, ReasonCreated)
	if got, ok := s.namespace(t, theirs); !ok || got.DeletionTimestamp != nil {
		t.Errorf("namespace %s of the other consumer deleted", theirs)
	}
}

// Deleting a request deletes its namespace, and then the request goes.
func (s *mirrorSuite) testDelete(t *testing.T) {
	ctx := t.Context()
	c := s.newConsumer(t, grant.Limits{})
	name := remoteName(t, "shop", c.id)
	r := c.request(t, name, "shop")
	s.waitStatus(t, c, name, ReasonCreated)
	if err := c.client.Delete(ctx, r); err != nil {
		t.Fatalf("the consumer deletes its request: %v", err)
	}
	eventually.Within(t, 120*time.Second, "request "+name+" gone", func() error {
		err := c.client.Get(ctx, client.ObjectKeyFromObject(r), &v1alpha1.NamespaceRequest{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("request still there: %v", err)
	})
	if _, ok := s.namespace(t, name); ok {
		t.Errorf("request %s gone before its namespace", name)
	}
}

// A mirrored namespace whose request vanished (its finalizer taken off by
// an admin) is deleted.
func (s *mirrorSuite) testGarbage(t *testing.T) {
	ctx := t.Context()
	c := s.newConsumer(t, grant.Limits{})
	name, kept := remoteName(t, "shop", c.id), remoteName(t, "keep", c.id)
	c.request(t, name, "shop")
	c.request(t, kept, "keep")
	r := s.waitStatus(t, c, name, ReasonCreated)
	s.waitStatus(t, c, kept, ReasonCreated)
	patch := client.MergeFrom(r.DeepCopy())
	r.Finalizers = nil
	if err := s.admin.Patch(ctx, r, patch); err != nil {
		t.Fatal(err)
	}
	if err := s.admin.Delete(ctx, r); err != nil {
		t.Fatal(err)
	}
	s.waitGone(t, name)
	if ns, ok := s.namespace(t, kept); !ok || ns.DeletionTimestamp != nil {
		t.Errorf("namespace %s, still requested, was deleted", kept)
	}
}

// Revoking the grant removes the consumer's mirrored namespaces and its
// tenant, even with the requests' finalizers on them.
func (s *mirrorSuite) testRevoke(t *testing.T) {
	c := s.newConsumer(t, grant.Limits{})
	a, b := remoteName(t, "a", c.id), remoteName(t, "b", c.id)
	c.request(t, a, "a")
	c.request(t, b, "b")
	s.waitStatus(t, c, a, ReasonCreated)
	s.waitStatus(t, c, b, ReasonCreated)
	s.stop() // revocation does not need the controller
	defer s.start()
	if err := s.tenants.Remove(t.Context(), c.id); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{a, b, c.tenant} {
		s.waitGone(t, ns)
	}
}

// A controller stopped mid-way and started again converges: a request
// deleted and one made meanwhile are handled, nothing is duplicated, and
// what stays is not recreated.
func (s *mirrorSuite) testRestart(t *testing.T) {
	ctx := t.Context()
	c := s.newConsumer(t, grant.Limits{Namespaces: 2})
	stays, goes, later := remoteName(t, "stays", c.id), remoteName(t, "goes", c.id), remoteName(t, "later", c.id)
	c.request(t, stays, "stays")
	r := c.request(t, goes, "goes")
	s.waitStatus(t, c, stays, ReasonCreated)
	s.waitStatus(t, c, goes, ReasonCreated)
	before, _ := s.namespace(t, stays)

	s.stop()
	if err := c.client.Delete(ctx, r); err != nil {
		t.Fatal(err)
	}
	c.request(t, later, "later")
	s.start()

	s.waitGone(t, goes)
	s.waitStatus(t, c, later, ReasonCreated)
	got, ok := s.namespace(t, stays)
	if !ok || got.UID != before.UID {
		t.Errorf("namespace %s recreated or gone across the restart", stays)
	}
	var list corev1.NamespaceList
	if err := s.admin.List(ctx, &list, client.MatchingLabelsSelector{Selector: offload.MirroredSelector(c.id)}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			names = append(names, ns.Name)
		}
	}
	slices.Sort(names)
	if want := []string{later, stays}; !slices.Equal(names, want) {
		t.Errorf("mirrored namespaces after the restart: %v, want %v", names, want)
	}
	// Every other subtest's consumer is gone: the gauge counts these two.
	eventually.Within(t, 30*time.Second, "flotilla_mirror_namespaces 2", func() error {
		if got := testutil.ToFloat64(s.last.m.namespaces); got != 2 {
			return fmt.Errorf("flotilla_mirror_namespaces = %v", got)
		}
		return nil
	})
}
