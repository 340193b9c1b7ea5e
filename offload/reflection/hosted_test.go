package reflection

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
)

// thirdEnv is a reflectEnv whose consumer A also offloads to two more
// providers, B (a peer of the provider P) and C (not one), each seen by
// A and by P in views of their own; P runs HostedEndpoints with its
// agent's own token (deploy/'s RBAC and admission).
type thirdEnv struct {
	*reflectEnv
	b, c     string
	hosted   *HostedEndpoints
	hostedRg *prometheus.Registry
}

// B's pods in 10.1.0.0/16, C's in 10.2.0.0/16; A sees them in
// 10.72.0.0/16 and 10.73.0.0/16. P sees only the lower half of B's
// range, in 10.71.0.0/17: B's 10.1.200.1 is outside P's views.
var (
	cPodCIDR          = netip.MustParsePrefix("10.2.0.0/16")
	consumerViewOfC   = netip.MustParsePrefix("10.73.0.0/16")
	providerSeesOfB   = netip.MustParsePrefix("10.1.0.0/17")
	providerViewOfBLo = netip.MustParsePrefix("10.71.0.0/17")
)

func newThirdEnv(t testing.TB) *thirdEnv {
	e := &thirdEnv{reflectEnv: &reflectEnv{PodEnv: offloadenv.NewPodEnv(t, offloadenv.PodEnvOptions{}), ns: "app"}, b: offloadtest.NewConsumer(t), c: offloadtest.NewConsumer(t)}
	var err error
	if e.lcx, err = client.New(e.Local.Config, client.Options{Scheme: reflectScheme()}); err != nil {
		t.Fatal(err)
	}
	if e.pcx, err = client.New(e.Provider.CP.Config, client.Options{Scheme: reflectScheme()}); err != nil {
		t.Fatal(err)
	}
	e.remote = e.OffloadReady(t, e.ns)

	// A's Reflector, with its views of P, B and C.
	e.registry = prometheus.NewRegistry()
	local := rest.CopyConfig(e.Local.Config)
	local.QPS, local.Burst = -1, -1
	r, err := NewReflector(ReflectorConfig{
		Config: local, Self: e.Self, Credentials: e.Creds,
		Views: manyViews{e.Views,
			{Provider: e.b, Real: thirdPodCIDR, View: consumerViewOfB},
			{Provider: e.c, Real: cPodCIDR, View: consumerViewOfC}},
		Logger:  slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: e.registry, Workers: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.reflectors = append(e.reflectors, r)
	e.stop = offloadtest.RunUntilCleanup(t, "Reflector", r.Run)

	// P knows B as a peer, and not C.
	if err := e.Provider.Admin.Create(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: e.b}}); err != nil {
		t.Fatal(err)
	}
	e.hostedRg = prometheus.NewRegistry()
	// As the agent's (agent.KubeConfig): no client-side rate limit.
	agent := offloadtest.ServiceAccountConfig(t, e.Provider.CP, "flotilla-system", "flotilla-agent")
	agent.QPS, agent.Burst = -1, -1
	e.hosted, err = NewHostedEndpoints(HostedEndpointsConfig{
		Config: agent, Self: e.Provider.ID, Peers: offloadtest.StartSharedCache(t, agent, nil),
		Views:   manyViews{{Provider: e.b, Real: providerSeesOfB, View: providerViewOfBLo}},
		Logger:  slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: e.hostedRg,
		// One worker: what is queued first is decided first, the
		// witness for what is not written.
		Workers: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	offloadtest.RunUntilCleanup(t, "HostedEndpoints", e.hosted.Run)
	return e
}

// translatedSliceOf is the name of P's slice for local slice's endpoints
// on cluster.
func translatedSliceOf(local, cluster string) string {
	return hostedSliceName(thirdSliceName(local, cluster))
}

func addressesOf(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Addresses...)
	}
	return out
}

func (e *thirdEnv) setEndpoints(t *testing.T, name string, eps ...discoveryv1.Endpoint) {
	t.Helper()
	var s discoveryv1.EndpointSlice
	if err := e.lcx.Get(t.Context(), client.ObjectKey{Namespace: e.ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	s.Endpoints = eps
	if err := e.lcx.Update(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
}

func TestEndpointsOnThirdClusters(t *testing.T) {
	e := newThirdEnv(t)
	ctx := t.Context()
	ready := true
	on := func(node string, addr string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: offloadtest.Ptr(node)}
	}
	e.create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "api"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt(8080), Protocol: corev1.ProtocolTCP}},
	}})
	e.create(t, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "api-manual", Labels: map[string]string{
			discoveryv1.LabelServiceName: "api", discoveryv1.LabelManagedBy: "test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: offloadtest.Ptr("http"), Port: offloadtest.Ptr(int32(8080)), Protocol: offloadtest.Ptr(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			on("worker", "10.244.1.5"),
			// B's 10.1.5.6 and 10.1.200.1, as A sees them.
			on(offload.VirtualNodeName(e.b), "10.72.5.6"),
			on(offload.VirtualNodeName(e.b), "10.72.200.1"),
		},
	})
	translated := translatedSliceOf("api-manual", e.b)

	t.Run("the provider routes to its view of the third cluster's pod", func(t *testing.T) {
		got := waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, translated, func(s *discoveryv1.EndpointSlice) error {
			if s.Labels[discoveryv1.LabelServiceName] != "api" || s.Labels[discoveryv1.LabelManagedBy] != offload.HostedEndpointsManagedBy {
				return fmt.Errorf("labels %v", s.Labels)
			}
			if !slices.Equal(addressesOf(s), []string{"10.71.5.6"}) {
				return fmt.Errorf("addresses %v, want 10.71.5.6 (the provider's view of B's 10.1.5.6)", addressesOf(s))
			}
			return nil
		})
		if c := got.Endpoints[0].Conditions; c.Ready == nil || !*c.Ready {
			t.Fatalf("conditions %+v, want ready", c)
		}
		// What A wrote is not routed by itself: no service-name label.
		src := waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, thirdSliceName("api-manual", e.b), nil)
		if _, ok := src.Labels[discoveryv1.LabelServiceName]; ok || src.Labels[offload.LabelEndpointsOf] != e.b {
			t.Fatalf("the consumer's slice is labelled %v", src.Labels)
		}
		if !slices.Equal(addressesOf(src), []string{"10.1.5.6", "10.1.200.1"}) {
			t.Fatalf("the consumer wrote %v, want B's own 10.1.5.6 and 10.1.200.1", addressesOf(src))
		}
		// The one P has no view of is dropped and counted.
		if n := testutil.ToFloat64(e.hosted.m.dropped.WithLabelValues(e.Self, hostedDropUntranslatable)); n != 1 {
			t.Fatalf("untranslatable endpoints counted %v, want 1", n)
		}
		// The consumer's own reflection carries its local pod, and
		// counts nothing dropped for B.
		waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, "api-manual", func(s *discoveryv1.EndpointSlice) error {
			if !slices.Equal(addressesOf(s), []string{"10.80.1.5"}) {
				return fmt.Errorf("addresses %v", addressesOf(s))
			}
			return nil
		})
		if n := testutil.ToFloat64(e.reflectors[0].m.dropped.WithLabelValues(e.Provider.ID, dropThirdCluster)); n != 0 {
			t.Fatalf("third-cluster endpoints counted as dropped: %v", n)
		}
	})

	t.Run("a slice in a namespace not mirrored for a consumer is not read", func(t *testing.T) {
		// The consumer's slice, copied by someone into a namespace of
		// the provider's own.
		src := waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, thirdSliceName("api-manual", e.b), nil)
		if err := e.pcx.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}); err != nil {
			t.Fatal(err)
		}
		copied := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "plain", Name: src.Name, Labels: src.Labels, Annotations: src.Annotations},
			AddressType: src.AddressType, Endpoints: src.Endpoints, Ports: src.Ports,
		}
		if err := e.pcx.Create(ctx, copied); err != nil {
			t.Fatal(err)
		}
		// Witness: a change in the mirrored namespace, queued after the
		// copy (one worker), is acted on.
		tamperAndWaitPutBack(t, e.reflectEnv, translated, "10.71.9.8", "10.71.5.6")
		var there discoveryv1.EndpointSliceList
		if err := e.pcx.List(ctx, &there, client.InNamespace("plain")); err != nil {
			t.Fatal(err)
		}
		if len(there.Items) != 1 {
			t.Fatalf("%d slices in the namespace not mirrored, want only the copy", len(there.Items))
		}
	})

	t.Run("a translated slice changed behind the agent's back is put back", func(t *testing.T) {
		tamperAndWaitPutBack(t, e.reflectEnv, translated, "10.71.9.9", "10.71.5.6")
	})

	t.Run("a cluster the provider does not peer with is refused", func(t *testing.T) {
		e.setEndpoints(t, "api-manual", on("worker", "10.244.1.5"), on(offload.VirtualNodeName(e.b), "10.72.5.6"), on(offload.VirtualNodeName(e.c), "10.73.0.9"))
		// Witness: the consumer wrote it, and P refused it.
		waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, thirdSliceName("api-manual", e.c), nil)
		eventually.Within(t, 30*time.Second, "the refusal counted", func() error {
			if n := testutil.ToFloat64(e.hosted.m.dropped.WithLabelValues(e.Self, hostedDropUnknownCluster)); n != 1 {
				return fmt.Errorf("unknown-cluster endpoints counted %v, want 1", n)
			}
			return nil
		})
		e.remoteAbsent(t, &discoveryv1.EndpointSlice{}, translatedSliceOf("api-manual", e.c))
		var list discoveryv1.EndpointSliceList
		if err := e.pcx.List(ctx, &list, client.InNamespace(e.remote), client.MatchingLabels{discoveryv1.LabelManagedBy: offload.HostedEndpointsManagedBy}); err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 || list.Items[0].Name != translated {
			t.Fatalf("%d translated slices, want only %s", len(list.Items), translated)
		}
	})

	t.Run("a slice outside the consumers' namespaces, or naming the provider, is not translated", func(t *testing.T) {
		// As a consumer's reflection writes it, but in a namespace of
		// the provider's users.
		outside := thirdSliceOf("outside", "api", e.b, "10.1.0.5")
		outside.Namespace, outside.UID = metav1.NamespaceDefault, ""
		outside.Annotations = nil
		if err := e.pcx.Create(ctx, outside); err != nil {
			t.Fatal(err)
		}
		self := thirdSliceOf("self", "api", e.Provider.ID, "10.0.0.5")
		// No origin: the consumer's Reflector leaves it alone.
		self.Namespace, self.UID, self.Annotations = e.remote, "", nil
		if err := e.pcx.Create(ctx, self); err != nil {
			t.Fatal(err)
		}
		// Witness: the one queued after it refused.
		eventually.Within(t, 30*time.Second, "the provider named refused", func() error {
			if n := testutil.ToFloat64(e.hosted.m.dropped.WithLabelValues(e.Self, hostedDropUnknownCluster)); n != 2 {
				return fmt.Errorf("unknown-cluster endpoints counted %v, want 2", n)
			}
			return nil
		})
		for _, s := range []*discoveryv1.EndpointSlice{outside, self} {
			err := e.pcx.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: hostedSliceName(s.Name)}, &discoveryv1.EndpointSlice{})
			if !apierrors.IsNotFound(err) {
				t.Fatalf("translation of %s/%s: %v, want none", s.Namespace, s.Name, err)
			}
		}
	})

	t.Run("an endpoint removed is gone from the provider", func(t *testing.T) {
		e.setEndpoints(t, "api-manual", on("worker", "10.244.1.5"))
		e.waitRemoteGone(t, &discoveryv1.EndpointSlice{}, translated)
		e.waitRemoteGone(t, &discoveryv1.EndpointSlice{}, thirdSliceName("api-manual", e.b))
		e.waitRemoteGone(t, &discoveryv1.EndpointSlice{}, thirdSliceName("api-manual", e.c))
	})

	t.Run("a foreign slice of the translation's name is left alone", func(t *testing.T) {
		name := translatedSliceOf("api-manual", e.b)
		theirs := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: e.remote, Name: name, Labels: map[string]string{discoveryv1.LabelManagedBy: "someone"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.1"}}},
		}
		if err := e.pcx.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		e.setEndpoints(t, "api-manual", on("worker", "10.244.1.5"), on(offload.VirtualNodeName(e.b), "10.72.5.7"))
		waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, thirdSliceName("api-manual", e.b), nil)
		// Witness: a write refused, retried (the controller's log); the
		// foreign slice keeps its content.
		eventually.Within(t, 30*time.Second, "the foreign slice met", func() error {
			if e.hosted.queue.NumRequeues(types.NamespacedName{Namespace: e.remote, Name: thirdSliceName("api-manual", e.b)}) == 0 {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		var got discoveryv1.EndpointSlice
		if err := e.pcx.Get(ctx, client.ObjectKeyFromObject(theirs), &got); err != nil {
			t.Fatal(err)
		}
		if got.UID != theirs.UID || !slices.Equal(addressesOf(&got), []string{"192.0.2.1"}) || got.Labels[discoveryv1.LabelManagedBy] != "someone" {
			t.Fatalf("foreign slice touched: %v %v", got.Labels, addressesOf(&got))
		}
		if err := e.pcx.Delete(ctx, theirs); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, name, func(s *discoveryv1.EndpointSlice) error {
			if !slices.Equal(addressesOf(s), []string{"10.71.5.7"}) {
				return fmt.Errorf("addresses %v", addressesOf(s))
			}
			return nil
		})
	})

	t.Run("a peer gone takes its translations, and back brings them back", func(t *testing.T) {
		name := translatedSliceOf("api-manual", e.b)
		if err := e.Provider.Admin.Delete(ctx, &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: e.b}}); err != nil {
			t.Fatal(err)
		}
		e.waitRemoteGone(t, &discoveryv1.EndpointSlice{}, name)
		if err := e.Provider.Admin.Create(ctx, &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: e.b}}); err != nil {
			t.Fatal(err)
		}
		waitRemote(t, e.reflectEnv, &discoveryv1.EndpointSlice{}, name, func(s *discoveryv1.EndpointSlice) error {
			if !slices.Equal(addressesOf(s), []string{"10.71.5.7"}) {
				return fmt.Errorf("addresses %v", addressesOf(s))
			}
			return nil
		})
	})
}

// tamperAndWaitPutBack sets the first endpoint of the provider's slice
// name to addr behind the agent's back and waits until the agent put
// want back.
func tamperAndWaitPutBack(t *testing.T, e *reflectEnv, name, addr, want string) {
	t.Helper()
	var s discoveryv1.EndpointSlice
	if err := e.pcx.Get(t.Context(), client.ObjectKey{Namespace: e.remote, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	s.Endpoints[0].Addresses = []string{addr}
	if err := e.pcx.Update(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
	waitRemote(t, e, &discoveryv1.EndpointSlice{}, name, func(s *discoveryv1.EndpointSlice) error {
		if !slices.Equal(addressesOf(s), []string{want}) {
			return fmt.Errorf("addresses %v", addressesOf(s))
		}
		return nil
	})
}
