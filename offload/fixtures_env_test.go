package offload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

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
	grantedBy(e.creds, t, tenants, e.self, p, p.cp.Config.Host)
}

// grantedBy makes consumer's tenant on p with tenants and holds a token
// of it, to be used at server (p's API server, or a way to it), as a
// provider's grant hands one over.
func grantedBy(c *testCredentials, t testing.TB, tenants *Tenants, consumer string, p *testProvider, server string) {
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

// installProvider applies what a provider's agent is installed with:
// its namespace and account, deploy/'s RBAC (the consumer's ClusterRole
// among it) and admission policies.
func installProvider(t testing.TB, cp *harness.ControlPlane) {
	t.Helper()
	for _, f := range []string{"namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "admission.yaml"} {
		cmd := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), "--kubeconfig", cp.Kubeconfig,
			"apply", "--server-side", "-f", filepath.Join("..", "deploy", f))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl apply deploy/%s: %v\n%s", f, err, out)
		}
	}
}

// podEnv is a consumer and a provider, each a real control plane, with a
// real grant between them: deploy/'s RBAC and admission on the provider,
// the consumer's tenant and token made by the provider's Tenants with the
// agent's own token, and namespace mirroring running on both sides. The
// provider's nodes are the harness's stand-in kubelets; the consumer's
// virtual node is a Node the test keeps Ready. The consumer reaches the
// provider through a link the test can cut.
type podEnv struct {
	*mirrorEnv
	p      *testProvider
	grants *grants
	link   *cutLink
	views  offsetViews
	node   string // the virtual node
}

// podEnvOptions are what a test or benchmark varies.
type podEnvOptions struct {
	// kubelets are the provider's nodes (each holds 250 pods), at most
	// 16.
	kubelets int
	// consumer's control plane; its scheduler, say.
	consumer harness.ControlPlaneOptions
	// clientQPS of both controller managers and schedulers (0: theirs).
	clientQPS int
}

func newPodEnv(tb testing.TB, o podEnvOptions) *podEnv {
	harness.Require(tb, harness.NeedsControlPlane...)
	// The NamespaceOffload caches log through controller-runtime, which
	// otherwise complains that nobody set its logger.
	ctrllog.SetLogger(logr.Discard())
	env := harness.New(tb)
	consOpts := o.consumer
	consOpts.ClientQPS = o.clientQPS
	// The provider's nodes get their pod ranges from us, not from its
	// controller manager: /20s, so that a node hands out more addresses
	// than its 250 pods (the stand-in kubelet never reuses one).
	cps := env.ControlPlanesEach(consOpts, harness.ControlPlaneOptions{Scheduler: true, ClientQPS: o.clientQPS})
	cons, prov := cps[0], cps[1]
	mustApplyCRDsTo(tb, cps...)
	installProvider(tb, prov)

	e := &podEnv{mirrorEnv: &mirrorEnv{local: cons, lc: adminClient(tb, cons), self: newConsumer(tb),
		creds: &testCredentials{m: map[string]providerCredential{}}}}
	e.p = &testProvider{id: newConsumer(tb), cp: prov, admin: adminClient(tb, prov)}
	e.providers = []*testProvider{e.p}
	e.views = offsetViews{provider: e.p.id, real: providerPodCIDR, view: viewOfProviderPods}
	e.link = newCutLink(tb, prov.Addr.String())

	agent := serviceAccountConfig(tb, prov, "flotilla-system", "flotilla-agent")
	tenants, err := NewTenants(TenantsConfig{Config: agent, Audience: acceptedAudience})
	if err != nil {
		tb.Fatal(err)
	}
	grantedBy(e.creds, tb, tenants, e.self, e.p, "https://"+e.link.addr)
	e.grants = &grants{m: map[string]grant.Limits{e.self: {}}}
	hosted, err := NewMirrorProvider(MirrorProviderConfig{
		Config: agent, Tenants: tenants, Grants: e.grants, AgentNamespace: "flotilla-system",
		Resync: time.Second, Shared: startSharedCache(tb, agent, nil), Logger: slog.New(slog.NewTextHandler(testWriter{tb}, nil)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	runUntilCleanup(tb, "MirrorProvider", hosted.Run)
	e.addPeer(tb, e.p.id, "p1", map[string]string{"region": "a"})
	e.start(tb) // the MirrorConsumer

	for i := range o.kubelets {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(16 * i), 0}), 20)
		prov.StartKubelet(fmt.Sprintf("node%d", i+1), harness.KubeletOptions{PodCIDR: cidr})
	}
	e.node = keepVirtualNodeReady(tb, cons, e.p.id)
	return e
}

// offloadReady offloads namespace ns to the provider and waits until it
// is Ready there; it returns the namespace's name on the provider.
func (e *podEnv) offloadReady(tb testing.TB, ns string) string {
	tb.Helper()
	e.offload(tb, ns, "offload", v1alpha1.NamespaceOffloadSpec{})
	e.waitStatus(tb, ns, "Ready", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
	remote, err := RemoteNamespace(v1alpha1.MappingDefaultName, ns, "", e.self)
	if err != nil {
		tb.Fatal(err)
	}
	return remote
}

// keepVirtualNodeReady registers the virtual node of provider on cp, as
// the node controller would (labels, taint, address, capacity), and
// keeps it Ready (its lease renewed) until the test ends.
func keepVirtualNodeReady(tb testing.TB, cp *harness.ControlPlane, provider string) string {
	tb.Helper()
	name := VirtualNodeName(provider)
	ctx := tb.Context()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			LabelVirtualNode: "true", LabelClusterID: provider, "kubernetes.io/hostname": name,
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "virtual-kubelet",
		}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: TaintVirtualNode, Value: "true", Effect: corev1.TaintEffectNoExecute}}},
	}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("1000"), corev1.ResourceMemory: resource.MustParse("4Ti"), corev1.ResourcePods: resource.MustParse("10000"),
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status = corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: virtualNodeAddress.String()}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test",
				Message: "kept Ready by the test", LastHeartbeatTime: now, LastTransitionTime: now}},
		}
		_, err = cp.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	renewCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		leases := cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		seconds := int32(40)
		for {
			now := metav1.NewMicroTime(time.Now())
			l, err := leases.Get(renewCtx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, err = leases.Create(renewCtx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &seconds, RenewTime: &now}}, metav1.CreateOptions{})
			case err == nil:
				l.Spec.RenewTime = &now
				_, err = leases.Update(renewCtx, l, metav1.UpdateOptions{})
			}
			if err != nil && renewCtx.Err() == nil {
				tb.Logf("renew the lease of virtual node %s: %v", name, err)
			}
			select {
			case <-renewCtx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
	})
	tb.Cleanup(func() { cancel(); wg.Wait() })
	return name
}

// cutLink is the consumer's way to the provider's API server: a TCP relay
// the test cuts (every connection closed, new ones refused, as a network
// gone) and restores on the same address.
type cutLink struct {
	addr, target string

	mu    sync.Mutex
	l     net.Listener
	down  bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newCutLink(tb testing.TB, target string) *cutLink {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c := &cutLink{addr: l.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	c.serve(l)
	tb.Cleanup(func() {
		c.cut()
		c.wg.Wait()
	})
	return c
}

func (c *cutLink) serve(l net.Listener) {
	c.mu.Lock()
	c.l, c.down = l, false
	c.mu.Unlock()
	c.wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			c.wg.Go(func() { c.relay(in) })
		}
	})
}

func (c *cutLink) relay(in net.Conn) {
	out, err := net.Dial("tcp", c.target)
	if err != nil {
		in.Close()
		return
	}
	c.mu.Lock()
	if c.down {
		c.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	c.conns[in], c.conns[out] = true, true
	c.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	in.Close()
	out.Close()
	<-done
	c.mu.Lock()
	delete(c.conns, in)
	delete(c.conns, out)
	c.mu.Unlock()
}

// cut closes every connection and refuses new ones.
func (c *cutLink) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	c.l.Close()
	for conn := range c.conns {
		conn.Close()
	}
}

// restore listens on the same address again.
func (c *cutLink) restore(tb testing.TB) {
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", c.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("restore the link on %s: %v", c.addr, err)
	}
	c.serve(l)
}

// secondIdentity gives the provider a second identity, as one back with
// its state wiped has: a Peer of its own, the same credential (the same
// API server, tenant and mirrored namespace) and the same views. It
// returns the new identity's ID.
func (e *podEnv) secondIdentity(t *testing.T) string {
	t.Helper()
	newID := newConsumer(t)
	cfg, g, err := e.creds.Credential(e.p.id)
	if err != nil {
		t.Fatal(err)
	}
	g.Provider = newID
	e.creds.set(newID, providerCredential{config: cfg, grant: g})
	e.addPeer(t, newID, "p1-again", map[string]string{"region": "a"})
	e.views.alias = newID
	return newID
}
