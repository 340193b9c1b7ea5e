package mcs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/test/harness"
)

// cluster is one control plane with its Services controller.
type cluster struct {
	name  string
	id    identity.Identity
	cp    *harness.ControlPlane
	admin client.Client
	svcs  *Services
	stop  func()
	// serials persist across a restart of svcs.
	serials *memSerials
}

// federation is the clusters of a test, their messages carried by an
// in-memory bus in place of the gossip (the e2e runs the real one).
type federation struct {
	mu       sync.Mutex
	clusters map[string]*cluster
}

// newFederation starts n control planes with the CRDs installed and a
// Services controller in each, every one Connected to every other.
func newFederation(tb testing.TB, names ...string) (*federation, []*cluster) {
	harness.Require(tb, harness.NeedsControlPlane...)
	ctrllog.SetLogger(logr.Discard())
	env := harness.New(tb)
	cps := env.ControlPlanes(len(names), harness.ControlPlaneOptions{})
	f := &federation{clusters: map[string]*cluster{}}
	var out []*cluster
	for i, n := range names {
		c := &cluster{name: n, id: mustIdentity(tb), cp: cps[i], serials: &memSerials{m: map[string][]byte{}}}
		admin, err := client.New(cps[i].Config, client.Options{Scheme: Scheme()})
		if err != nil {
			tb.Fatal(err)
		}
		c.admin = admin
		out = append(out, c)
	}
	offloadtest.MustApplyCRDsTo(tb, cps...)
	for _, c := range out {
		f.clusters[c.id.ClusterID()] = c
	}
	for _, c := range out {
		f.start(tb, c)
	}
	return f, out
}

// start runs c's Services and connects it with every other cluster.
func (f *federation) start(tb testing.TB, c *cluster) {
	// What the exporter reads of the cluster comes from a cache shared
	// with the agent's other components, as in the agent.
	shared, err := offload.NewSharedCache(c.cp.Config, nil)
	if err != nil {
		tb.Fatal(err)
	}
	offloadtest.RunUntilCleanup(tb, "the shared cache of "+c.name, shared.Start)
	svcs, err := New(Config{
		Config: c.cp.Config, Identity: c.id, Send: f.sender(c.id.ClusterID()), Views: f.views(c.id.ClusterID()),
		Serials: c.serials, Grace: 3 * time.Second, Resync: time.Second, Shared: shared,
		Logger: slog.New(slog.NewTextHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("cluster", c.name),
	})
	if err != nil {
		tb.Fatal(err)
	}
	f.mu.Lock()
	c.svcs = svcs
	f.mu.Unlock()
	c.stop = offloadtest.RunUntilCleanup(tb, "Services of "+c.name, svcs.Run)
	for id, o := range f.clusters {
		if id == c.id.ClusterID() {
			continue
		}
		c.svcs.PeerChanged(peering.PeerState{ClusterID: id, IdentityKey: o.id.Public(), Phase: peering.PhaseConnected})
		if o.svcs != nil && o != c {
			o.svcs.PeerChanged(peering.PeerState{ClusterID: c.id.ClusterID(), IdentityKey: c.id.Public(), Phase: peering.PhaseConnected})
		}
	}
}

// sender delivers from's messages to the Services of the addressee.
func (f *federation) sender(from string) func(context.Context, string, []byte) error {
	return func(_ context.Context, to string, msg []byte) error {
		f.mu.Lock()
		c := f.clusters[to]
		f.mu.Unlock()
		if c == nil || c.svcs == nil {
			return fmt.Errorf("%s: no such member", to)
		}
		c.svcs.Receive(msg)
		return nil
	}
}

// views gives every cluster's pods (10.1.0.0/16 in each) a view of its
// own here, by the first letter of its name: a's 10.200.0.0/16, b's
// 10.201.0.0/16 and so on; anything else is untranslatable.
func (f *federation) views(self string) Views {
	return viewsFunc(func(cluster string, a netip.Addr) (netip.Addr, bool) {
		f.mu.Lock()
		defer f.mu.Unlock()
		c := f.clusters[cluster]
		if c == nil || !netip.MustParsePrefix("10.1.0.0/16").Contains(a) {
			return netip.Addr{}, false
		}
		i := int(c.name[0] - 'a')
		b := a.As4()
		return netip.AddrFrom4([4]byte{10, byte(200 + i), b[2], b[3]}), true
	})
}

type viewsFunc func(string, netip.Addr) (netip.Addr, bool)

func (v viewsFunc) Translate(c string, a netip.Addr) (netip.Addr, bool) { return v(c, a) }

type memSerials struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memSerials) LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m[name]; ok {
		return v, nil
	}
	v, err := create()
	if err == nil {
		s.m[name] = v
	}
	return v, err
}

func (s *memSerials) PutKey(name string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = value
	return nil
}

type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(string(p))
	return len(p), nil
}

// exportService creates namespace ns (if missing), a Service without
// selector, its EndpointSlice of addrs, and the ServiceExport.
func (c *cluster) exportService(tb testing.TB, ns, name string, port int32, addrs ...string) {
	tb.Helper()
	c.ensureNamespace(tb, ns)
	c.createService(tb, ns, name, port, addrs...)
	c.createExport(tb, ns, name)
}

// createService creates a Service without selector, port http, and its
// EndpointSlice of addrs.
func (c *cluster) createService(tb testing.TB, ns, name string, port int32, addrs ...string) {
	tb.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: port}}}}
	if err := c.admin.Create(context.Background(), svc); err != nil {
		tb.Fatal(err)
	}
	c.setEndpoints(tb, ns, name, addrs...)
}

func (c *cluster) createExport(tb testing.TB, ns, name string) {
	tb.Helper()
	se := &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := c.admin.Create(context.Background(), se); err != nil {
		tb.Fatal(err)
	}
}

func (c *cluster) ensureNamespace(tb testing.TB, ns string) {
	tb.Helper()
	err := c.admin.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !isAlreadyExists(err) {
		tb.Fatal(err)
	}
}

// setEndpoints writes the Service's one EndpointSlice, as the
// EndpointSlice controller would for its pods.
func (c *cluster) setEndpoints(tb testing.TB, ns, name string, addrs ...string) {
	tb.Helper()
	ctx := context.Background()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-pods",
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	var cur discoveryv1.EndpointSlice
	if err := c.admin.Get(ctx, client.ObjectKeyFromObject(es), &cur); err == nil {
		cur.Endpoints = es.Endpoints
		if err := c.admin.Update(ctx, &cur); err != nil {
			tb.Fatal(err)
		}
		return
	}
	if err := c.admin.Create(ctx, es); err != nil {
		tb.Fatal(err)
	}
}

func isAlreadyExists(err error) bool {
	var s interface{ Status() metav1.Status }
	return errors.As(err, &s) && s.Status().Reason == metav1.StatusReasonAlreadyExists
}
