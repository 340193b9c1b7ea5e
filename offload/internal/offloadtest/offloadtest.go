package offloadtest

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	dto "github.com/prometheus/client_model/go"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// applyCRDs creates the embedded CRDs, as the agent does at start, and
// waits until each is established.
func applyCRDs(ctx context.Context, cfg *rest.Config) error {
	return harness.ApplyCRDs(ctx, cfg, deploy.CRDs, "crds/*.yaml")
}

func MustApplyCRDs(t testing.TB, cfg *rest.Config) {
	t.Helper()
	if err := applyCRDs(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

// MustApplyCRDsTo applies the CRDs to every control plane at once.
func MustApplyCRDsTo(tb testing.TB, cps ...*harness.ControlPlane) {
	tb.Helper()
	var wg sync.WaitGroup
	for _, cp := range cps {
		wg.Go(func() {
			if err := applyCRDs(context.Background(), cp.Config); err != nil {
				tb.Error(err)
			}
		})
	}
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
}

// JWTHeader starts every service account token ({"alg":...).
const JWTHeader = "eyJhbGciOi"

func Ptr[T any](v T) *T { return &v }

// ExpiryGauge is flotilla_certificate_expiry_seconds of component and
// cert in reg.
func ExpiryGauge(t *testing.T, reg *prometheus.Registry, component, cert string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flotilla_certificate_expiry_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["component"] == component && labels["cert"] == cert {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no flotilla_certificate_expiry_seconds{component=%q,cert=%q}", component, cert)
	return 0
}

// Credentials hand out what each provider granted: a real token of
// its tenant (remote.Consumer does the same from sealed grants).
type Credentials struct {
	mu   sync.Mutex
	Held map[string]remote.ProviderCredential
}

func (c *Credentials) Credential(provider string) (*rest.Config, grant.Grant, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc, ok := c.Held[provider]
	if !ok {
		return nil, grant.Grant{}, fmt.Errorf("no credential from %s: it has not granted offloading to this cluster", provider)
	}
	return rest.CopyConfig(pc.Config), pc.Grant, nil
}

func (c *Credentials) Set(provider string, pc remote.ProviderCredential) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Held[provider] = pc
}

func (c *Credentials) Drop(provider string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.Held, provider)
}

type LogWriter struct{ T testing.TB }

func (w LogWriter) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func AdminClient(t testing.TB, cp *harness.ControlPlane) client.Client {
	t.Helper()
	scheme := kruntime.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{v1alpha1.AddToScheme, corev1.AddToScheme, apiextensionsv1.AddToScheme} {
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

// Grants is what tenancy.Grants would say, set by the test.
type Grants struct {
	Mu     sync.Mutex
	Limits map[string]grant.Limits
}

func (g *Grants) Granted(consumer string) (grant.Limits, bool) {
	g.Mu.Lock()
	defer g.Mu.Unlock()
	l, ok := g.Limits[consumer]
	return l, ok
}

func (g *Grants) Set(consumer string, l grant.Limits) {
	g.Mu.Lock()
	defer g.Mu.Unlock()
	g.Limits[consumer] = l
}

// ServiceAccountConfig is a client config with a token of account, as a
// pod of it gets one.
func ServiceAccountConfig(t testing.TB, cp *harness.ControlPlane, ns, account string) *rest.Config {
	t.Helper()
	expiry := int64(3600)
	tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, account, err)
	}
	return &rest.Config{Host: cp.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.Config.CAData}}
}

// The provider's pod network, the consumer's view of it, and the
// address the consumer's virtual node registers (TEST-NET-1).
var (
	ProviderPodCIDR    = netip.MustParsePrefix("10.0.0.0/16")
	ViewOfProviderPods = netip.MustParsePrefix("10.70.0.0/16")
	VirtualNodeAddress = netip.MustParseAddr("192.0.2.10")
)

// RunUntilCleanup runs a controller's Run until the stop it returns is
// called, once, or the test ends; an error from Run fails the test,
// named what.
func RunUntilCleanup(tb testing.TB, what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("%s: %v", what, err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

// OffsetViews is the consumer's view of one provider's pod network: the
// same offset in another prefix.
type OffsetViews struct {
	Provider   string
	Real, View netip.Prefix
	// Alias is another identity of the same provider (one back under a
	// new identity), with the same view.
	Alias string
}

func (v OffsetViews) Translate(provider string, a netip.Addr) (netip.Addr, bool) {
	if (provider != v.Provider && (v.Alias == "" || provider != v.Alias)) || !a.Is4() || !v.Real.Contains(a) {
		return netip.Addr{}, false
	}
	host := ^uint32(0) >> v.Real.Bits()
	ab, vb := a.As4(), v.View.Addr().As4()
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], binary.BigEndian.Uint32(vb[:])&^host|binary.BigEndian.Uint32(ab[:])&host)
	return netip.AddrFrom4(out), true
}

// TranslateIP is ip as the consumer sees it; it fails tb if the view
// does not cover it.
func (v OffsetViews) TranslateIP(tb testing.TB, ip string) string {
	a, ok := v.Translate(v.Provider, netip.MustParseAddr(ip))
	if !ok {
		tb.Fatalf("the provider's pod IP %s is outside %s", ip, v.Real)
	}
	return a.String()
}

func (v OffsetViews) ToRemote(provider string, a netip.Addr) (netip.Addr, bool) {
	if provider != v.Provider || !v.View.Contains(a) {
		return netip.Addr{}, false
	}
	return OffsetViews{Provider: provider, Real: v.View, View: v.Real}.Translate(provider, a)
}

func (v OffsetViews) AsSeenBy(provider string, a netip.Addr) (netip.Addr, bool) {
	if provider != v.Provider {
		return netip.Addr{}, false
	}
	return OffsetViews{Provider: provider, Real: consumerPodCIDR, View: ProviderViewOfConsumer}.Translate(provider, a)
}

// rotationSeen follows a CA rotation from outside, observation after
// observation: the CAs published (by subject key ID) and the CA that
// signed the certificate served.
type rotationSeen struct {
	first    []string
	sawBoth  bool
	issuers  []string
	deadline time.Time
}

func NewRotationSeen(t *testing.T, first []string) *rotationSeen {
	t.Helper()
	if len(first) != 1 {
		t.Fatalf("CAs published before any rotation: %v, want 1", first)
	}
	return &rotationSeen{first: first, deadline: time.Now().Add(120 * time.Second)}
}

// Observe notes what is published and who signed what is served; true
// once the first CA is gone, having been published beside its successor
// and both having signed.
func (r *rotationSeen) Observe(t *testing.T, published []string, issuer string) bool {
	t.Helper()
	if len(published) == 2 {
		r.sawBoth = true
	}
	if len(r.issuers) == 0 || r.issuers[len(r.issuers)-1] != issuer {
		r.issuers = append(r.issuers, issuer)
	}
	if len(published) == 1 && published[0] != r.first[0] && r.sawBoth && len(r.issuers) >= 2 {
		if r.issuers[0] != r.first[0] {
			t.Errorf("the first serving certificate was signed by %s, not the first CA %s", r.issuers[0], r.first[0])
		}
		return true
	}
	if time.Now().After(r.deadline) {
		t.Fatalf("no full rotation seen: published %v (first %v), both seen %v, issuers %v", published, r.first, r.sawBoth, r.issuers)
	}
	return false
}

func (r *rotationSeen) String() string {
	return fmt.Sprintf("serving certificate issuers %v; first CA %v", r.issuers, r.first)
}

// GrantNodesProxy lets user use verbs on nodes/proxy of every node of
// cp (the kubelet API), through a ClusterRole and a binding of name.
func GrantNodesProxy(t *testing.T, cp *harness.ControlPlane, name, user string, verbs ...string) *rbacv1.ClusterRoleBinding {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: verbs}},
	}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return binding
}

// StartSharedCache is the agent's SharedCache over cfg's API server, run
// until the test ends: the components a test starts and restarts read
// through it as in the agent, where it outlives them.
func StartSharedCache(tb testing.TB, cfg *rest.Config, peers offload.PeerCache) *offload.SharedCache {
	tb.Helper()
	c, err := offload.NewSharedCache(cfg, peers)
	if err != nil {
		tb.Fatal(err)
	}
	RunUntilCleanup(tb, "the shared cache", c.Start)
	return c
}

const AcceptedAudience = offload.DefaultAudience

func NewConsumer(t testing.TB) string {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id.ClusterID()
}

// BundleIDs are the subject key IDs of the CAs in a caBundle.
func BundleIDs(t *testing.T, bundle []byte) []string {
	t.Helper()
	var ids []string
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			return ids
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, hex.EncodeToString(c.SubjectKeyId))
	}
}

// The consumer's own pod network, and how the provider sees it (the
// networks its EndpointSlices may point at there).
var (
	consumerPodCIDR        = netip.MustParsePrefix("10.244.0.0/16")
	ProviderViewOfConsumer = netip.MustParsePrefix("10.80.0.0/16")
)

// InstallProvider applies what a provider's agent is installed with:
// its namespace and account, deploy/'s RBAC (the consumer's ClusterRole
// among it) and every file of admission policies.
func InstallProvider(t testing.TB, cp *harness.ControlPlane) {
	t.Helper()
	installDeploy(t, cp, append([]string{"namespace.yaml", "serviceaccount.yaml", "rbac.yaml"}, AdmissionFiles(t)...)...)
}

// AdmissionFiles are deploy/'s files of admission policies
// (admission*.yaml): a provider proves every one in force before it
// grants.
func AdmissionFiles(t testing.TB) []string {
	t.Helper()
	paths, err := filepath.Glob(DeployFile("admission*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("deploy/admission*.yaml: %v (%d files)", err, len(paths))
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = filepath.Base(p)
	}
	return names
}

// InstallConsumer applies the rights a consumer's agent is installed
// with: its namespace and account, deploy/'s RBAC and the ClusterRole
// reflection is bound in each offloaded namespace.
func InstallConsumer(t testing.TB, cp *harness.ControlPlane) {
	t.Helper()
	installDeploy(t, cp, "namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "reflection.yaml")
}

func installDeploy(t testing.TB, cp *harness.ControlPlane, files ...string) {
	t.Helper()
	args := []string{"--kubeconfig", cp.Kubeconfig, "apply", "--server-side"}
	for _, f := range files {
		args = append(args, "-f", DeployFile(f))
	}
	if out, err := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), args...).CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply deploy/ %v: %v\n%s", files, err, out)
	}
}

// DeployFile is the path of deploy/name in this checkout, wherever the
// test runs from.
func DeployFile(name string) string {
	_, self, _, _ := runtime.Caller(0) // offload/internal/offloadtest/
	return filepath.Join(filepath.Dir(self), "..", "..", "..", "deploy", name)
}

// MetricOf is the series of metric name in reg that has every label of
// labels, nil when there is none.
func MetricOf(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			has := map[string]string{}
			for _, l := range m.GetLabel() {
				has[l.GetName()] = l.GetValue()
			}
			if matchesAll(has, labels) {
				return m
			}
		}
	}
	return nil
}

func matchesAll(has, want map[string]string) bool {
	for k, v := range want {
		if has[k] != v {
			return false
		}
	}
	return true
}
