package offloadenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/mirror"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/offload/tenancy"
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

// MirrorEnv is a consumer control plane and two providers, each with the
// CRDs and a real tenant for the consumer.
type MirrorEnv struct {
	Local      *harness.ControlPlane
	LocalAdmin client.Client // admin of the consumer
	Self       string
	Creds      *offloadtest.Credentials
	Providers  []*Provider
	// shared is what each mirror.Consumer reads NamespaceOffloads,
	// Namespaces and Peers from, as in the agent; it outlives each of
	// them (nil: each reads them itself).
	shared *offload.SharedCache
	// trace, when set, records the requests of the mirror.Consumer on
	// the consumer's API server.
	trace *harness.Trace
}

type Provider struct {
	ID     string
	CP     *harness.ControlPlane
	Admin  client.Client
	tenant string
}

func NewMirrorEnv(t *testing.T) *MirrorEnv {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cps := env.ControlPlanes(3, harness.ControlPlaneOptions{})
	e := &MirrorEnv{Local: cps[0], Self: offloadtest.NewConsumer(t), Creds: &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}}}
	e.LocalAdmin = offloadtest.AdminClient(t, e.Local)
	offloadtest.MustApplyCRDs(t, e.Local.Config)
	e.shared = offloadtest.StartSharedCache(t, e.Local.Config, nil)
	for i, cp := range cps[1:] {
		offloadtest.MustApplyCRDs(t, cp.Config)
		p := &Provider{ID: offloadtest.NewConsumer(t), CP: cp, Admin: offloadtest.AdminClient(t, cp)}
		e.grant(t, p)
		e.Providers = append(e.Providers, p)
		e.AddPeer(t, p.ID, fmt.Sprintf("p%d", i+1), map[string]string{"region": string(rune('a' + i))})
	}
	return e
}

// grant makes the consumer's tenant on p and a credential for it, as the
// provider's grant does; the ClusterRole has the namespacerequests rule
// the design gives the consumer.
func (e *MirrorEnv) grant(t *testing.T, p *Provider) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: offload.ConsumerClusterRole},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"namespacerequests"},
			Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"},
		}},
	}
	if _, err := p.CP.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenants, err := tenancy.NewTenants(tenancy.TenantsConfig{Config: p.CP.Config, Client: p.CP.Client, Audience: offloadtest.AcceptedAudience})
	if err != nil {
		t.Fatal(err)
	}
	grantedBy(e.Creds, t, tenants, e.Self, p, p.CP.Config.Host)
}

// grantedBy makes consumer's tenant on p with tenants and holds a token
// of it, to be used at server (p's API server, or a way to it), as a
// provider's grant hands one over.
func grantedBy(c *offloadtest.Credentials, t testing.TB, tenants *tenancy.Tenants, consumer string, p *Provider, server string) {
	t.Helper()
	tenant, err := tenants.Ensure(t.Context(), consumer, ConsumerLimits)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tenants.Issue(t.Context(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	p.tenant = tenant.Namespace
	c.Set(p.ID, remote.ProviderCredential{
		Config: &rest.Config{Host: server, BearerToken: tok.Value.Reveal(),
			TLSClientConfig: rest.TLSClientConfig{CAData: p.CP.Config.CAData}, Timeout: 10 * time.Second},
		Grant: grant.Grant{Provider: p.ID, Consumer: consumer, Serial: 1, Server: server,
			Namespace: tenant.Namespace, ExpiresAt: tok.Expires},
	})
}

// ConsumerLimits are the grant's terms in these environments: no limits,
// and the consumer's EndpointSlices may point into the provider's view of
// it (as the grants controller sets from the peering's views).
var ConsumerLimits = grant.Limits{Fence: grant.Fence{EndpointNetworks: offloadtest.ProviderViewOfConsumer.String()}}

// LabelProvider is the label the consumer's admin puts on the Peer of
// every provider here (AddPeer), so that EveryProvider selects them all:
// an empty clusterSelector selects none.
const LabelProvider = "test.flotilla.io/provider"

// EveryProvider is the clusterSelector of every provider AddPeer wrote.
func EveryProvider() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{LabelProvider: "true"}}
}

// AddPeer writes the consumer's Peer for a provider, granted (its
// OffloadCredential condition set, as remote.Consumer writes it), with
// labels and LabelProvider as its admin's and the name label the agent
// writes.
func (e *MirrorEnv) AddPeer(t testing.TB, id, name string, labels map[string]string) {
	t.Helper()
	l := withProvider(labels)
	l[v1alpha1.LabelClusterName] = name
	peer := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: l}}
	if err := e.LocalAdmin.Create(t.Context(), peer); err != nil {
		t.Fatal(err)
	}
	peer.Status.ClusterName = name
	meta.SetStatusCondition(&peer.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionOffloadCredential, Status: metav1.ConditionTrue, Reason: "Ready", Message: "test"})
	if err := e.LocalAdmin.Status().Update(t.Context(), peer); err != nil {
		t.Fatal(err)
	}
}

func withProvider(labels map[string]string) map[string]string {
	l := maps.Clone(labels)
	if l == nil {
		l = map[string]string{}
	}
	l[LabelProvider] = "true"
	return l
}

// SetLabels sets the labels of id's Peer, LabelProvider and the name
// label kept.
func (e *MirrorEnv) SetLabels(t *testing.T, id string, labels map[string]string) {
	t.Helper()
	var peer v1alpha1.Peer
	if err := e.LocalAdmin.Get(t.Context(), client.ObjectKey{Name: id}, &peer); err != nil {
		t.Fatal(err)
	}
	name := peer.Labels[v1alpha1.LabelClusterName]
	peer.Labels = withProvider(labels)
	if name != "" {
		peer.Labels[v1alpha1.LabelClusterName] = name
	}
	if err := e.LocalAdmin.Update(t.Context(), &peer); err != nil {
		t.Fatal(err)
	}
}

// Start runs a mirror.Consumer until the returned stop is called (or the
// test ends).
func (e *MirrorEnv) Start(t testing.TB) (stop func()) {
	t.Helper()
	local := e.Local.Config
	if e.trace != nil {
		local = e.trace.Wrap(local, "consumer")
	}
	mc, err := mirror.NewConsumer(mirror.ConsumerConfig{
		Config: local, Credentials: e.Creds, Self: e.Self, Peers: e.shared,
		Logger: slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelDebug})), Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return offloadtest.RunUntilCleanup(t, "mirror.Consumer.Run", mc.Run)
}

// Offload creates namespace ns and a NamespaceOffload in it, and labels
// the namespace LabelOffloaded=true, as the administrator's `flotilla
// offload namespace` does; a spec without a clusterSelector gets
// EveryProvider.
func (e *MirrorEnv) Offload(t testing.TB, ns, name string, spec v1alpha1.NamespaceOffloadSpec) {
	t.Helper()
	if spec.ClusterSelector == nil {
		spec.ClusterSelector = EveryProvider()
	}
	err := e.LocalAdmin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := e.LocalAdmin.Create(t.Context(), &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	e.LabelOffloaded(t, ns, true)
}

// WaitStatus waits until the NamespaceOffload ns/offload satisfies check.
func (e *MirrorEnv) WaitStatus(t testing.TB, ns, what string, check func(o *v1alpha1.NamespaceOffload) error) *v1alpha1.NamespaceOffload {
	t.Helper()
	var o v1alpha1.NamespaceOffload
	eventually.Within(t, 30*time.Second, what, func() error {
		if err := e.LocalAdmin.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "offload"}, &o); err != nil {
			return err
		}
		if err := check(&o); err != nil {
			return fmt.Errorf("%w; status %s", err, DescribeOffload(&o))
		}
		return nil
	})
	return &o
}

func DescribeOffload(o *v1alpha1.NamespaceOffload) string {
	s := fmt.Sprintf("phase %s gen %d/%d", o.Status.Phase, o.Status.ObservedGeneration, o.Generation)
	for _, c := range o.Status.Clusters {
		if r := meta.FindStatusCondition(c.Conditions, offload.ConditionReady); r != nil {
			s += fmt.Sprintf("; %s(%s) %s %s: %s", c.ClusterName, c.RemoteNamespace, r.Status, r.Reason, r.Message)
		}
	}
	return s
}

// PhaseIs checks the phase and, per cluster name, the Ready reason; no
// other cluster may be listed.
func PhaseIs(phase v1alpha1.OffloadPhase, reasons map[string]string) func(*v1alpha1.NamespaceOffload) error {
	return func(o *v1alpha1.NamespaceOffload) error {
		if o.Status.Phase != phase || o.Status.ObservedGeneration != o.Generation {
			return errors.New("not yet")
		}
		if len(o.Status.Clusters) != len(reasons) {
			return errors.New("clusters differ")
		}
		for _, c := range o.Status.Clusters {
			r := meta.FindStatusCondition(c.Conditions, offload.ConditionReady)
			if r == nil || reasons[c.ClusterName] != r.Reason {
				return errors.New("reasons differ")
			}
		}
		return nil
	}
}

// Requests lists the requests mirroring ns on p.
func (p *Provider) Requests(t *testing.T, ns string) []v1alpha1.NamespaceRequest {
	t.Helper()
	var list v1alpha1.NamespaceRequestList
	if err := p.Admin.List(t.Context(), &list, client.InNamespace(p.tenant), client.MatchingLabels{v1alpha1.LabelMirroredFrom: ns}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// WaitRequest waits until p holds exactly one request for ns, named name.
func (p *Provider) WaitRequest(t *testing.T, ns, name string) v1alpha1.NamespaceRequest {
	t.Helper()
	var got v1alpha1.NamespaceRequest
	eventually.Within(t, 30*time.Second, "request for "+ns+" on "+p.ID, func() error {
		rs := p.Requests(t, ns)
		if len(rs) != 1 || rs[0].Name != name || rs[0].Spec.SourceNamespace != ns {
			return fmt.Errorf("requests %v", RequestNames(rs))
		}
		got = rs[0]
		return nil
	})
	return got
}

func RequestNames(rs []v1alpha1.NamespaceRequest) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name+"<-"+r.Spec.SourceNamespace)
	}
	return out
}

// AnswerAsProvider does, by hand, what the provider's agent does with a
// request (offload/mirror_provider*.go; the lead's e2e test runs the real
// one): Created makes the namespace and holds the request with its
// finalizer; Refused only answers.
func (p *Provider) AnswerAsProvider(t *testing.T, name string, phase v1alpha1.RequestPhase, reason, message string) {
	t.Helper()
	ctx := t.Context()
	var r v1alpha1.NamespaceRequest
	if err := p.Admin.Get(ctx, client.ObjectKey{Namespace: p.tenant, Name: name}, &r); err != nil {
		t.Fatal(err)
	}
	if phase == v1alpha1.RequestCreated {
		err := p.Admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			offload.LabelTenant: strings.TrimPrefix(p.tenant, offload.TenantPrefix), "app.kubernetes.io/managed-by": "flotilla",
			v1alpha1.LabelMirroredFrom: r.Spec.SourceNamespace}}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if controllerutil.AddFinalizer(&r, v1alpha1.FinalizerRequest) {
			if err := p.Admin.Update(ctx, &r); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.Status = v1alpha1.NamespaceRequestStatus{Phase: phase, Reason: reason, Message: message, ObservedGeneration: r.Generation}
	if err := p.Admin.Status().Update(ctx, &r); err != nil {
		t.Fatal(err)
	}
}

// ReleaseAsProvider is the provider's agent acting on a deleted request:
// the namespace goes, then the finalizer.
func (p *Provider) ReleaseAsProvider(t *testing.T, name string) {
	t.Helper()
	ctx := t.Context()
	if err := p.Admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	var r v1alpha1.NamespaceRequest
	if err := p.Admin.Get(ctx, client.ObjectKey{Namespace: p.tenant, Name: name}, &r); err != nil {
		t.Fatal(err)
	}
	if r.DeletionTimestamp == nil {
		t.Fatalf("request %s on %s is not being deleted", name, p.ID)
	}
	controllerutil.RemoveFinalizer(&r, v1alpha1.FinalizerRequest)
	if err := p.Admin.Update(ctx, &r); err != nil {
		t.Fatal(err)
	}
}

func (e *MirrorEnv) NamespaceLabels(t *testing.T, ns string) map[string]string {
	t.Helper()
	var n corev1.Namespace
	if err := e.LocalAdmin.Get(t.Context(), client.ObjectKey{Name: ns}, &n); err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

// LabelOffloaded sets LabelOffloaded=true on namespace ns, or removes
// it, as the administrator (`flotilla offload namespace` does): the agent
// may not.
func (e *MirrorEnv) LabelOffloaded(t testing.TB, ns string, on bool) {
	t.Helper()
	value := "null"
	if on {
		value = `"true"`
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, offload.LabelOffloaded, value)
	if err := e.LocalAdmin.Patch(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// PlacementIs checks the NamespaceOffload's Placement condition.
func PlacementIs(status metav1.ConditionStatus, reason string) func(*v1alpha1.NamespaceOffload) error {
	return func(o *v1alpha1.NamespaceOffload) error {
		c := meta.FindStatusCondition(o.Status.Conditions, v1alpha1.ConditionPlacement)
		if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != o.Generation {
			return fmt.Errorf("Placement %+v, want %s %s", c, status, reason)
		}
		return nil
	}
}

// WaitGone waits until ns/offload no longer exists.
func (e *MirrorEnv) WaitGone(t *testing.T, ns string) {
	t.Helper()
	eventually.Within(t, 30*time.Second, "NamespaceOffload in "+ns+" gone", func() error {
		var o v1alpha1.NamespaceOffload
		err := e.LocalAdmin.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "offload"}, &o)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: %s, finalizers %v", DescribeOffload(&o), o.Finalizers)
	})
}

// PodEnv is a consumer and a provider, each a real control plane, with a
// real grant between them: deploy/'s RBAC and admission on the provider,
// the consumer's tenant and token made by the provider's Tenants with the
// agent's own token, and namespace mirroring running on both sides. The
// provider's nodes are the harness's stand-in kubelets; the consumer's
// virtual node is a Node the test keeps Ready. The consumer reaches the
// provider through a link the test can cut.
type PodEnv struct {
	*MirrorEnv
	Provider *Provider
	Grants   *offloadtest.Grants
	Link     *Link
	Views    offloadtest.OffsetViews
	Node     string // the virtual node
}

// PodEnvOptions are what a test or benchmark varies.
type PodEnvOptions struct {
	// Kubelets are the provider's nodes (each holds 250 pods), at most
	// 16.
	Kubelets int
	// Consumer sets up the consumer's control plane; its scheduler, say.
	Consumer harness.ControlPlaneOptions
	// ClientQPS of both controller managers and schedulers (0: theirs).
	ClientQPS int
	// Trace, when set, records every request of the controllers of both
	// sides: the consumer's on its own API server ("consumer") and on the
	// provider's ("consumer@provider"), the provider's on its own
	// ("provider").
	Trace *harness.Trace
}

func NewPodEnv(tb testing.TB, o PodEnvOptions) *PodEnv {
	harness.Require(tb, harness.NeedsControlPlane...)
	// The NamespaceOffload caches log through controller-runtime, which
	// otherwise complains that nobody set its logger.
	ctrllog.SetLogger(logr.Discard())
	env := harness.New(tb)
	consOpts := o.Consumer
	consOpts.ClientQPS = o.ClientQPS
	// The provider's nodes get their pod ranges from us, not from its
	// controller manager: /20s, so that a node hands out more addresses
	// than its 250 pods (the stand-in kubelet never reuses one).
	cps := env.ControlPlanesEach(consOpts, harness.ControlPlaneOptions{Scheduler: true, ClientQPS: o.ClientQPS})
	cons, prov := cps[0], cps[1]
	offloadtest.MustApplyCRDsTo(tb, cps...)
	offloadtest.InstallProvider(tb, prov)

	e := &PodEnv{MirrorEnv: &MirrorEnv{Local: cons, LocalAdmin: offloadtest.AdminClient(tb, cons), Self: offloadtest.NewConsumer(tb),
		Creds: &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}}}}
	e.Provider = &Provider{ID: offloadtest.NewConsumer(tb), CP: prov, Admin: offloadtest.AdminClient(tb, prov)}
	e.Providers = []*Provider{e.Provider}
	e.Views = offloadtest.OffsetViews{Provider: e.Provider.ID, Real: offloadtest.ProviderPodCIDR, View: offloadtest.ViewOfProviderPods}
	e.Link = newCutLink(tb, prov.Addr.String())
	e.trace = o.Trace

	agent := offloadtest.ServiceAccountConfig(tb, prov, "flotilla-system", "flotilla-agent")
	if o.Trace != nil {
		agent = o.Trace.Wrap(agent, "provider")
	}
	tenants, err := tenancy.NewTenants(tenancy.TenantsConfig{Config: agent, Audience: offloadtest.AcceptedAudience,
		PodNetworks: func(context.Context) ([]netip.Prefix, error) { return []netip.Prefix{offloadtest.ProviderPodCIDR}, nil }})
	if err != nil {
		tb.Fatal(err)
	}
	grantedBy(e.Creds, tb, tenants, e.Self, e.Provider, "https://"+e.Link.addr)
	if o.Trace != nil {
		cfg, g, _ := e.Creds.Credential(e.Provider.ID)
		e.Creds.Set(e.Provider.ID, remote.ProviderCredential{Config: o.Trace.Wrap(cfg, "consumer@provider"), Grant: g})
	}
	e.Grants = &offloadtest.Grants{Limits: map[string]grant.Limits{e.Self: ConsumerLimits}}
	hosted, err := mirror.NewProvider(mirror.ProviderConfig{
		Config: agent, Tenants: tenants, Grants: e.Grants, AgentNamespace: "flotilla-system",
		Resync: time.Second, Shared: offloadtest.StartSharedCache(tb, agent, nil), Logger: slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: tb}, nil)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	offloadtest.RunUntilCleanup(tb, "MirrorProvider", hosted.Run)
	e.AddPeer(tb, e.Provider.ID, "p1", map[string]string{"region": "a"})
	e.Start(tb) // the mirror.Consumer

	for i := range o.Kubelets {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(16 * i), 0}), 20)
		prov.StartKubelet(fmt.Sprintf("node%d", i+1), harness.KubeletOptions{PodCIDR: cidr})
	}
	e.Node = KeepVirtualNodeReady(tb, cons, e.Provider.ID)
	return e
}

// OffloadReady offloads namespace ns to the provider and waits until it
// is Ready there; it returns the namespace's name on the provider.
func (e *PodEnv) OffloadReady(tb testing.TB, ns string) string {
	tb.Helper()
	e.Offload(tb, ns, "offload", v1alpha1.NamespaceOffloadSpec{})
	e.WaitStatus(tb, ns, "Ready", PhaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
	remote, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, ns, "", e.Self)
	if err != nil {
		tb.Fatal(err)
	}
	return remote
}

// KeepVirtualNodeReady registers the virtual node of provider on cp, as
// the node controller would (labels, taint, address, capacity), and
// keeps it Ready (its lease renewed) until the test ends.
func KeepVirtualNodeReady(tb testing.TB, cp *harness.ControlPlane, provider string) string {
	tb.Helper()
	name := offload.VirtualNodeName(provider)
	ctx := tb.Context()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			offload.LabelVirtualNode: "true", offload.LabelClusterID: provider, "kubernetes.io/hostname": name,
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "virtual-kubelet",
		}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: offload.TaintVirtualNode, Value: "true", Effect: corev1.TaintEffectNoExecute}}},
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
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: offloadtest.VirtualNodeAddress.String()}},
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

// Link is the consumer's way to the provider's API server: a TCP relay
// the test cuts (every connection closed, new ones refused, as a network
// gone) and restores on the same address.
type Link struct {
	addr, target string

	mu    sync.Mutex
	l     net.Listener
	down  bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newCutLink(tb testing.TB, target string) *Link {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Link{addr: l.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	c.serve(l)
	tb.Cleanup(func() {
		c.Cut()
		c.wg.Wait()
	})
	return c
}

func (c *Link) serve(l net.Listener) {
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

func (c *Link) relay(in net.Conn) {
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

// Cut closes every connection and refuses new ones.
func (c *Link) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	c.l.Close()
	for conn := range c.conns {
		conn.Close()
	}
}

// Restore listens on the same address again.
func (c *Link) Restore(tb testing.TB) {
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

// SecondIdentity gives the provider a second identity, as one back with
// its state wiped has: a Peer of its own, the same credential (the same
// API server, tenant and mirrored namespace) and the same views. It
// returns the new identity's ID.
func (e *PodEnv) SecondIdentity(t *testing.T) string {
	t.Helper()
	newID := offloadtest.NewConsumer(t)
	cfg, g, err := e.Creds.Credential(e.Provider.ID)
	if err != nil {
		t.Fatal(err)
	}
	g.Provider = newID
	e.Creds.Set(newID, remote.ProviderCredential{Config: cfg, Grant: g})
	e.AddPeer(t, newID, "p1-again", map[string]string{"region": "a"})
	e.Views.Alias = newID
	return newID
}
