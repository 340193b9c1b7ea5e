package mcsdns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/test/harness"
)

// dnsEnv is a control plane and a Server answering from it.
type dnsEnv struct {
	cfg      *rest.Config
	c        client.Client
	srv      *Server
	registry *prometheus.Registry
}

// newDNSEnv starts a control plane without the MCS CRDs, and a Server on
// loopback.
// newDNSEnv runs a server on a real control plane; opts change its
// Config.
func newDNSEnv(tb testing.TB, opts ...func(*Config)) *dnsEnv {
	harness.Require(tb, harness.NeedsControlPlane...)
	cp := harness.New(tb).ControlPlane("cp1", harness.ControlPlaneOptions{})
	scheme := runtimeScheme(tb)
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		tb.Fatal(err)
	}
	e := &dnsEnv{cfg: cp.Config, c: c, registry: prometheus.NewRegistry()}
	// Runs after the server's cleanup: its last words still reach the log.
	log := testLog{tb: tb, done: new(atomic.Bool)}
	tb.Cleanup(func() { log.done.Store(true) })
	cfg := Config{
		Config: cp.Config, Address: netip.MustParseAddrPort("127.0.0.1:0"),
		Logger: slog.New(slog.NewTextHandler(log, nil)), Metrics: e.registry,
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.srv, err = New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("server: %v", err)
		}
	})
	return e
}

func runtimeScheme(tb testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, mcsv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			tb.Fatal(err)
		}
	}
	return s
}

// installMCSCRDs creates the MCS API's CRDs from the module's embedded
// YAML, as the agent installs them, and waits until they are served.
func (e *dnsEnv) installMCSCRDs(tb testing.TB) {
	crds := apiextensionsclient.NewForConfigOrDie(e.cfg).ApiextensionsV1().CustomResourceDefinitions()
	for _, raw := range [][]byte{mcscrd.ServiceImportCRD, mcscrd.ServiceExportCRD} {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			tb.Fatal(err)
		}
		if _, err := crds.Create(tb.Context(), &crd, metav1.CreateOptions{}); err != nil {
			tb.Fatalf("create CRD %s: %v", crd.Name, err)
		}
	}
	// Served: a list of ServiceImports answers.
	poll(tb, "ServiceImports served", func(ctx context.Context) error {
		return e.c.List(ctx, &mcsv1alpha1.ServiceImportList{})
	})
}

// poll waits until f succeeds; the bound only keeps a broken run from
// hanging, it is no performance target.
func poll(tb testing.TB, what string, f func(ctx context.Context) error) {
	tb.Helper()
	var last error
	err := wait.PollUntilContextTimeout(tb.Context(), 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		last = f(ctx)
		return last == nil, nil
	})
	if err != nil {
		tb.Fatalf("%s: %v (last: %v)", what, err, last)
	}
}

// ask queries the server over net ("udp" or "tcp").
func (e *dnsEnv) ask(net, qname string, qtype uint16) (*dns.Msg, error) {
	c := &dns.Client{Net: net, Timeout: 5 * time.Second}
	req := new(dns.Msg)
	req.SetQuestion(qname, qtype)
	resp, _, err := c.Exchange(req, e.srv.Addr().String())
	return resp, err
}

// answers waits until qname's answer has rcode and records want.
func (e *dnsEnv) answers(tb testing.TB, net, qname string, qtype uint16, rcode int, want ...string) *dns.Msg {
	tb.Helper()
	var resp *dns.Msg
	poll(tb, fmt.Sprintf("%s %s over %s", qname, dns.TypeToString[qtype], net), func(context.Context) error {
		var err error
		if resp, err = e.ask(net, qname, qtype); err != nil {
			return err
		}
		if got := rdata(resp.Answer); resp.Rcode != rcode || !slices.Equal(got, want) {
			return fmt.Errorf("%s %q, want %s %q", dns.RcodeToString[resp.Rcode], got, dns.RcodeToString[rcode], want)
		}
		return nil
	})
	return resp
}

func (e *dnsEnv) create(tb testing.TB, objs ...client.Object) {
	tb.Helper()
	for _, o := range objs {
		if err := e.c.Create(tb.Context(), o); err != nil {
			tb.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// testLog writes the server's log into the test's.
type testLog struct {
	tb   testing.TB
	done *atomic.Bool // the test ended: logging would panic
}

func (w testLog) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.tb.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// A user's view: the server answers SERVFAIL until it can read the
// ServiceImports, then the clusterset names of the imports and their
// slices, over UDP and TCP, and follows changes.
func TestClustersetDNS(t *testing.T) {
	e := newDNSEnv(t)
	web := "web.shop.svc.clusterset.local."
	// No CRD yet: the server answers, but caches nothing as missing.
	e.answers(t, "udp", web, dns.TypeA, dns.RcodeServerFailure)

	e.installMCSCRDs(t)
	e.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	e.create(t, clusterSetImport("shop", "web", "10.100.0.7"), headlessImport("shop", "db"),
		importedSlice("shop", "db", "db-a", clusterA, discoveryv1.AddressTypeIPv4,
			endpoint{hostname: "db-0", addrs: []string{"10.1.0.10"}},
			endpoint{hostname: "db-1", ready: ptr.To(false), addrs: []string{"10.1.0.11"}}),
		importedSlice("shop", "db", "db-b", clusterB, discoveryv1.AddressTypeIPv4,
			endpoint{hostname: "db-0", addrs: []string{"10.2.0.10"}}))

	e.answers(t, "udp", web, dns.TypeA, dns.RcodeSuccess, "A 10.100.0.7")
	e.answers(t, "tcp", web, dns.TypeA, dns.RcodeSuccess, "A 10.100.0.7")
	e.answers(t, "udp", "_http._tcp."+web, dns.TypeSRV, dns.RcodeSuccess, "SRV 0 100 80 "+web)
	// Go's own resolver, as test/images/testserver -dns uses it: A and
	// AAAA asked together, the empty AAAA answer accepted.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, e.srv.Addr().String())
	}}
	if addrs, err := r.LookupHost(t.Context(), web); err != nil || !slices.Equal(addrs, []string{"10.100.0.7"}) {
		t.Errorf("Go resolver: %s: %v %v", web, addrs, err)
	}
	if _, srvs, err := r.LookupSRV(t.Context(), "http", "tcp", web); err != nil || len(srvs) != 1 || srvs[0].Port != 80 || srvs[0].Target != web {
		t.Errorf("Go resolver: SRV http tcp %s: %v", web, err)
	}
	db := "db.shop.svc.clusterset.local."
	e.answers(t, "udp", db, dns.TypeA, dns.RcodeSuccess, "A 10.1.0.10", "A 10.2.0.10")
	e.answers(t, "udp", "db-0."+clusterB+"."+db, dns.TypeA, dns.RcodeSuccess, "A 10.2.0.10")
	srv := e.answers(t, "tcp", "_db._tcp."+db, dns.TypeSRV, dns.RcodeSuccess,
		"SRV 0 100 5432 db-0."+clusterA+"."+db, "SRV 0 100 5432 db-0."+clusterB+"."+db)
	if got := rdata(srv.Extra); !slices.Equal(got, []string{"A 10.1.0.10", "A 10.2.0.10"}) {
		t.Errorf("SRV additional %q", got)
	}
	nx := e.answers(t, "udp", "nope.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError)
	if len(nx.Ns) != 1 || nx.Ns[0].Header().Rrtype != dns.TypeSOA || !nx.Authoritative {
		t.Errorf("NXDOMAIN without the zone's SOA: %v", nx)
	}
	e.answers(t, "udp", "web.shop.svc.cluster.local.", dns.TypeA, dns.RcodeRefused)

	// A slice someone else labelled with the Service's name adds nothing;
	// ours, written after it, is the witness that both were read.
	foreign := importedSlice("shop", "db", "foreign", clusterA, discoveryv1.AddressTypeIPv4,
		endpoint{hostname: "evil", addrs: []string{"10.9.9.9"}})
	delete(foreign.Labels, discoveryv1.LabelManagedBy)
	e.create(t, foreign, importedSlice("shop", "db", "db-c", clusterB, discoveryv1.AddressTypeIPv4,
		endpoint{hostname: "db-1", addrs: []string{"10.2.0.11"}}))
	e.answers(t, "udp", db, dns.TypeA, dns.RcodeSuccess, "A 10.1.0.10", "A 10.2.0.10", "A 10.2.0.11")
	e.answers(t, "udp", "evil."+clusterA+"."+db, dns.TypeA, dns.RcodeNameError)
	// Nor does a ServiceImport without our label (another
	// implementation's); ours, created after it, is the witness.
	foreignImport := clusterSetImport("shop", "theirs", "10.100.9.9")
	foreignImport.Labels = nil
	e.create(t, foreignImport, clusterSetImport("shop", "after", "10.100.0.9"))
	e.answers(t, "udp", "after.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "A 10.100.0.9")
	e.answers(t, "udp", "theirs.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError)

	// An endpoint turning ready appears; a ClusterSetIP that changes
	// follows; a ServiceImport deleted is gone.
	var slice discoveryv1.EndpointSlice
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: "shop", Name: "db-a"}, &slice); err != nil {
		t.Fatal(err)
	}
	slice.Endpoints[1].Conditions.Ready = ptr.To(true)
	if err := e.c.Update(t.Context(), &slice); err != nil {
		t.Fatal(err)
	}
	e.answers(t, "udp", "db-1."+clusterA+"."+db, dns.TypeA, dns.RcodeSuccess, "A 10.1.0.11")
	var imp mcsv1alpha1.ServiceImport
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: "shop", Name: "web"}, &imp); err != nil {
		t.Fatal(err)
	}
	imp.Spec.IPs = []string{"10.100.0.8"}
	if err := e.c.Update(t.Context(), &imp); err != nil {
		t.Fatal(err)
	}
	e.answers(t, "udp", web, dns.TypeA, dns.RcodeSuccess, "A 10.100.0.8")
	if err := e.c.Delete(t.Context(), &imp); err != nil {
		t.Fatal(err)
	}
	e.answers(t, "udp", web, dns.TypeA, dns.RcodeNameError)

	for _, m := range []struct{ qtype, rcode string }{{"A", "NOERROR"}, {"A", "NXDOMAIN"}, {"SRV", "NOERROR"}, {"A", "REFUSED"}} {
		if n := testutil.ToFloat64(e.srv.queries.WithLabelValues(m.qtype, m.rcode)); n < 1 {
			t.Errorf("metric queries{type=%s,rcode=%s} = %v", m.qtype, m.rcode, n)
		}
	}
}

// A taken port is an error at New, naming what to do.
func TestPortTaken(t *testing.T) {
	s, err := New(Config{Config: &rest.Config{}, Address: netip.MustParseAddrPort("127.0.0.1:0")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.tcp.Close()
	defer s.udp.Close()
	_, err = New(Config{Config: &rest.Config{}, Address: s.Addr()})
	if err == nil || !strings.Contains(err.Error(), "--clusterset-dns-port") {
		t.Fatalf("second server on %s: %v, want an error", s.Addr(), err)
	}
}
