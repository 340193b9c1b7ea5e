package policyapi

import (
	"context"
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
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// lastDataplane keeps the last state applied; the feed applies from its
// own goroutine.
type lastDataplane struct {
	mu   sync.Mutex
	last tunnel.Desired
	n    int
}

func (l *lastDataplane) Apply(_ context.Context, d tunnel.Desired) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last, l.n = d, l.n+1
	return nil
}
func (l *lastDataplane) Status() ([]tunnel.PeerStatus, error) { return nil, nil }
func (l *lastDataplane) PublicKey() tunnel.Key                { return tunnel.Key{} }

// sets is what the tunnel was last told of peer id: nil is Full.
func (l *lastDataplane) sets(id string) *policy.Sets {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.last.Peers {
		if p.ClusterID == id {
			return p.Segregated
		}
	}
	return nil
}

// trafficEnv is a real API server with the CRDs, a feed following it and
// the data plane it feeds, with peers b (a consumer of this cluster) and
// p (a provider of it) in the tunnel.
type trafficEnv struct {
	t    testing.TB
	c    client.Client
	dp   *lastDataplane
	feed *Feed
	reg  *prometheus.Registry
	logs *syncbuf.Buffer
}

func newTrafficEnv(t testing.TB, held []policy.Sets, def policy.Mode) *trafficEnv {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("traffic", harness.ControlPlaneOptions{})
	ctx := t.Context()
	// The embedded CRDs, as the agent installs them at start.
	if err := harness.ApplyCRDs(ctx, cp.Config, deploy.CRDs, "crds/*.yaml"); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Config, client.Options{Scheme: Scheme(), Mapper: trafficMapper()})
	if err != nil {
		t.Fatal(err)
	}
	e := &trafficEnv{t: t, c: c, dp: &lastDataplane{}, reg: prometheus.NewRegistry(), logs: &syncbuf.Buffer{}}
	log := slog.New(slog.NewTextHandler(e.logs, nil))
	seg := NewSegregatingDataplane(e.dp, held, log)
	// The engine applies its data path before the feed has synced.
	if err := seg.Apply(ctx, tunnel.Desired{Peers: []tunnel.Peer{{ClusterID: "b"}, {ClusterID: "p"}}}); err != nil {
		t.Fatal(err)
	}
	// The feed reads Peers, Namespaces, Services... from the cache the
	// agent's offloading shares, as in the agent.
	shared, err := offload.NewSharedCache(cp.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	sharedCtx, stopShared := context.WithCancel(context.Background())
	sharedDone := make(chan error, 1)
	go func() { sharedDone <- shared.Start(sharedCtx) }()
	t.Cleanup(func() {
		stopShared()
		if err := <-sharedDone; err != nil {
			t.Errorf("the shared cache: %v", err)
		}
	})
	e.feed, err = NewFeed(FeedConfig{Config: cp.Config, Dataplane: seg, Default: def, Peers: shared, Logger: log, Metrics: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run starts the feed until the test ends and waits until it decided.
func (e *trafficEnv) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.feed.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("feed: %v", err)
		}
	})
	eventually.Within(e.t, 30*time.Second, "the feed decides once synced", e.feed.Synced)
}

func (e *trafficEnv) create(objs ...client.Object) {
	e.t.Helper()
	for _, o := range objs {
		if err := e.c.Create(e.t.Context(), o); err != nil {
			e.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// want waits until peer id's sets as the tunnel has them are pods and
// services ("addr proto/port"); nil pods and services with full: Full.
func (e *trafficEnv) want(id string, full bool, pods []string, services []string) {
	e.t.Helper()
	what := fmt.Sprintf("peer %s Segregated to pods %v and services %v", id, pods, services)
	if full {
		what = "peer " + id + " Full"
	}
	eventually.Within(e.t, 20*time.Second, what, func() error {
		s := e.dp.sets(id)
		switch {
		case full && s == nil:
			return nil
		case full || s == nil:
			return fmt.Errorf("sets %+v", s)
		}
		var gotPods, gotServices []string
		for _, a := range s.Pods {
			gotPods = append(gotPods, a.String())
		}
		for _, ep := range s.Services {
			gotServices = append(gotServices, ep.String())
		}
		if !slices.Equal(gotPods, pods) || !slices.Equal(gotServices, services) {
			return fmt.Errorf("pods %v, services %v", gotPods, gotServices)
		}
		return nil
	})
}

// wantStatus waits until Peer id's status says mode and, Segregated, the
// sizes of its sets.
func (e *trafficEnv) wantStatus(id string, mode v1alpha1.Traffic, allowed *v1alpha1.TrafficAllowed) {
	e.t.Helper()
	eventually.Within(e.t, 20*time.Second, fmt.Sprintf("Peer %s status says %s, allowed %+v", id, mode, allowed), func() error {
		var p v1alpha1.Peer
		if err := e.c.Get(e.t.Context(), client.ObjectKey{Name: id}, &p); err != nil {
			return err
		}
		if p.Status.Traffic != mode || !equalAllowed(p.Status.Allowed, allowed) {
			return fmt.Errorf("status traffic %q, allowed %+v", p.Status.Traffic, p.Status.Allowed)
		}
		return nil
	})
}

// setTraffic writes spec.traffic of id's Peer as an admin does, with a
// merge patch: the feed writes the Peer's status meanwhile, so a read and
// an update would conflict.
func (e *trafficEnv) setTraffic(id string, mode v1alpha1.Traffic) {
	e.t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"traffic":%q}}`, mode)
	if err := e.c.Patch(e.t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		e.t.Fatal(err)
	}
}

func peerObject(id string, mode v1alpha1.Traffic) *v1alpha1.Peer {
	return &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id}, Spec: v1alpha1.PeerSpec{Traffic: mode}}
}

func namespaceObject(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// tenantNamespace is a namespace this cluster made for consumer.
func tenantNamespace(name, consumer string) *corev1.Namespace {
	return namespaceObject(name, map[string]string{offload.LabelTenant: consumer, v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})
}

// runPod creates a pod and gives it the addresses a kubelet would.
func (e *trafficEnv) runPod(ns, name string, ips ...string) {
	e.t.Helper()
	e.startPod(e.newPod(ns, name), ips...)
}

func (e *trafficEnv) newPod(ns, name string) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	e.create(p)
	return p
}

// startPod gives p the addresses a kubelet would.
func (e *trafficEnv) startPod(p *corev1.Pod, ips ...string) {
	e.t.Helper()
	ns, name := p.Namespace, p.Name
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ips[0]}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if err := e.c.Status().Update(e.t.Context(), p); err != nil {
		e.t.Fatalf("pod %s/%s status: %v", ns, name, err)
	}
}

func (e *trafficEnv) deletePod(ns, name string) {
	e.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := e.c.Delete(e.t.Context(), p, client.GracePeriodSeconds(0)); err != nil {
		e.t.Fatal(err)
	}
}

// service creates a Service without selector and its one EndpointSlice,
// as a user's or a controller's.
func (e *trafficEnv) service(ns, name string, port, target int32, addrs ...string) {
	e.t.Helper()
	e.create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: port, TargetPort: intstr.FromInt32(target), Protocol: corev1.ProtocolTCP}}}})
	tcp := corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "test"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: &target, Protocol: &tcp}}}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	e.create(es)
}

// offloadTo makes namespace ns offloaded to provider, as the mirror
// controller's status says once the namespace is mirrored there.
func (e *trafficEnv) offloadTo(ns, provider string) {
	e.t.Helper()
	o := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"}}
	e.create(o)
	o.Status.Clusters = []v1alpha1.ClusterOffload{{ClusterID: provider, RemoteNamespace: ns + "-" + provider}}
	if err := e.c.Status().Update(e.t.Context(), o); err != nil {
		e.t.Fatal(err)
	}
}

// What each peer may reach follows the cluster: a consumer's pods
// offloaded here come and go in its pods set, a provider gets the
// Services of the namespaces offloaded to it and every peer the exported
// ones, on their target ports; a Peer switches between Full and
// Segregated; its status says which, with the sizes of its sets.
func TestTrafficFeed(t *testing.T) {
	held := policy.Sets{Peer: "b", Pods: []netip.Addr{netip.MustParseAddr("10.0.9.9")}}
	e := newTrafficEnv(t, []policy.Sets{held}, policy.Full)
	// Before the informers synced, the kernel's sets are held.
	e.want("b", false, []string{"10.0.9.9"}, nil)
	e.create(peerObject("b", v1alpha1.TrafficSegregated), peerObject("p", ""))
	e.run()

	e.want("b", false, nil, nil)
	e.want("p", true, nil, nil)
	e.wantStatus("b", v1alpha1.TrafficSegregated, &v1alpha1.TrafficAllowed{})
	e.wantStatus("p", v1alpha1.TrafficFull, nil)

	// Offloaded pods come and go.
	e.create(tenantNamespace("flotilla-tenant-b", "b"), tenantNamespace("shop-b", "b"), namespaceObject("mine", nil))
	e.runPod("flotilla-tenant-b", "web", "10.0.1.5")
	e.runPod("shop-b", "db", "10.0.1.6")
	e.runPod("mine", "own", "10.0.1.7") // this cluster's own: never b's
	e.want("b", false, []string{"10.0.1.5", "10.0.1.6"}, nil)
	e.wantStatus("b", v1alpha1.TrafficSegregated, &v1alpha1.TrafficAllowed{Pods: 2})
	e.deletePod("flotilla-tenant-b", "web")
	e.want("b", false, []string{"10.0.1.6"}, nil)
	// The Peer status that change leads to, and the pass its event may
	// start, come before the count below begins.
	e.wantStatus("b", v1alpha1.TrafficSegregated, &v1alpha1.TrafficAllowed{Pods: 1})
	time.Sleep(3 * DefaultDebounce)

	// This cluster's own pods start no pass: ten of them run one after
	// another (each a creation and a status: twenty events), spaced by
	// more than the debounce so that each would start a pass of its own,
	// then a tenant's pod, the witness that the feed got past them. Its
	// events and the Peer status they lead to start at most four.
	before := testutil.ToFloat64(e.feed.m.passes)
	for i := range 10 {
		e.runPod("mine", fmt.Sprintf("own-%d", i), fmt.Sprintf("10.0.4.%d", i+1))
		time.Sleep(3 * DefaultDebounce)
	}
	e.runPod("shop-b", "witness", "10.0.1.9")
	e.want("b", false, []string{"10.0.1.6", "10.0.1.9"}, nil)
	e.wantStatus("b", v1alpha1.TrafficSegregated, &v1alpha1.TrafficAllowed{Pods: 2})
	if n := testutil.ToFloat64(e.feed.m.passes) - before; n > 4 {
		t.Errorf("%v passes for ten pods of this cluster's own and one of a tenant's, want at most 4", n)
	}
	e.deletePod("shop-b", "witness")
	e.want("b", false, []string{"10.0.1.6"}, nil)

	// Reflected and exported services.
	e.setTraffic("p", v1alpha1.TrafficSegregated)
	e.create(namespaceObject("shop", nil), namespaceObject("web", nil))
	e.service("shop", "api", 80, 8080, "10.0.2.1", "10.70.0.9") // a pod here, one on a third cluster (our view)
	e.service("shop", "hidden", 80, 8081, "10.0.2.2")           // no matter its name: the namespace goes
	e.offloadTo("shop", "p")
	e.want("p", false, nil, []string{"10.0.2.1 tcp/8080", "10.0.2.2 tcp/8081", "10.70.0.9 tcp/8080"})
	e.want("b", false, []string{"10.0.1.6"}, nil)

	e.service("web", "front", 443, 8443, "10.0.3.1")
	e.create(&mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}})
	e.want("p", false, nil, []string{"10.0.2.1 tcp/8080", "10.0.2.2 tcp/8081", "10.0.3.1 tcp/8443", "10.70.0.9 tcp/8080"})
	e.want("b", false, []string{"10.0.1.6"}, []string{"10.0.3.1 tcp/8443"})
	e.wantStatus("p", v1alpha1.TrafficSegregated, &v1alpha1.TrafficAllowed{Services: 4})

	// Full and back.
	e.setTraffic("b", v1alpha1.TrafficFull)
	e.want("b", true, nil, nil)
	e.wantStatus("b", v1alpha1.TrafficFull, nil)
	e.setTraffic("b", "") // follows --traffic, Full here
	e.setTraffic("b", v1alpha1.TrafficSegregated)
	e.want("b", false, []string{"10.0.1.6"}, []string{"10.0.3.1 tcp/8443"})
	e.wantStatus("b", v1alpha1.TrafficSegregated, &v1alpha1.TrafficAllowed{Pods: 1, Services: 1})

	// An IPv6 address is named and the rest kept.
	e.runPod("shop-b", "dual", "10.0.1.8", "fd00::8")
	e.want("b", false, []string{"10.0.1.6", "10.0.1.8"}, []string{"10.0.3.1 tcp/8443"})
	eventually.Within(t, 10*time.Second, "the IPv6 address logged", func() error {
		if l := e.logs.String(); !strings.Contains(l, "object=\"Pod shop-b/dual\"") || !strings.Contains(l, "fd00::8: the tunnel carries IPv4 only") {
			return fmt.Errorf("log:\n%s", l)
		}
		return nil
	})
	if n := testutil.ToFloat64(e.feed.m.problems.WithLabelValues("Pod")); n != 1 {
		t.Errorf("flotilla_policy_input_errors{kind=Pod} = %v, want 1", n)
	}

	if n := testutil.CollectAndCount(e.reg, "flotilla_policy_update_latency_seconds"); n != 1 {
		t.Errorf("latency histogram: %d series, want 1", n)
	}
	if c := histogramCount(t, e.reg, "flotilla_policy_update_latency_seconds"); c == 0 {
		t.Errorf("no update latency observed after every change above")
	}
}

func histogramCount(t testing.TB, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}
