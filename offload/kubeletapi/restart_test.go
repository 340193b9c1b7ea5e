package kubeletapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/test/harness"
)

// kubeletCAWorld is a consumer whose API server verifies kubelets with a
// CA it was started with, which sits in the kubelet API's CA Secret (as
// an operator who brings the CA puts it), a virtual node pointing at the
// kubelet API's address and a pod bound to it. There is no provider: the
// kubelet API's own answer for the pod (its namespace is not offloaded)
// is the witness that the API server's call got through TLS.
type kubeletCAWorld struct {
	cp   *harness.ControlPlane
	ca   *certs.CertAuthority
	addr netip.AddrPort
}

const caWorldPod = "web"

func newKubeletCAWorld(t *testing.T) *kubeletCAWorld {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	ca, err := certs.NewCA("test kubelet", time.Now(), DefaultCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	w := &kubeletCAWorld{ca: ca, addr: freeLoopback(t)}
	w.cp = env.ControlPlane("cons", harness.ControlPlaneOptions{KubeletCA: ca.PEM()})
	offloadtest.MustApplyCRDs(t, w.cp.Config)
	seedKubeletCA(t, w.cp, ca)
	ctx := t.Context()
	nodes := w.cp.Client.CoreV1().Nodes()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: offload.VirtualNodeName(offloadtest.NewConsumer(t)), Labels: map[string]string{offload.LabelVirtualNode: "true"}}}
	if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: w.addr.Addr().String()}}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(w.addr.Port())
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	createNamespace(t, w.cp, appsNS)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: appsNS, Name: caWorldPod},
		Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "server", Image: harness.TestServerImage}}},
	}
	if _, err := w.cp.Client.CoreV1().Pods(appsNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs a kubelet API, as a (re)started agent does, until stop or
// the test's end.
func (w *kubeletCAWorld) start(t *testing.T, tweak func(*Config)) (*Server, *prometheus.Registry, func() error) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{
		Client: w.cp.Client, Credentials: &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}},
		Address: w.addr.Addr(), Port: w.addr.Port(), AgentNamespace: testAgentNamespace,
		Logger: slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, nil)), Metrics: reg,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	api, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return api, reg, runKubeletAPI(t, api)
}

// logsThroughAPIServer is `kubectl logs` of the pod: the API server
// dials the virtual node's address and verifies the certificate it is
// served against the CA it was started with. nil when the request came
// through to api, which answered it (404: the pod's namespace is not
// offloaded; the API server passes on the code, not the message).
func (w *kubeletCAWorld) logsThroughAPIServer(t *testing.T, api *Server) error {
	served := api.m.requests.WithLabelValues("containerLogs", kubeletResultNotFound)
	before := testutil.ToFloat64(served)
	body, err := w.cp.Client.CoreV1().Pods(appsNS).GetLogs(caWorldPod, &corev1.PodLogOptions{Container: "server"}).DoRaw(t.Context())
	switch {
	case err == nil:
		return fmt.Errorf("logs of a pod whose namespace is not offloaded: %q", body)
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("kubectl logs: %w: %q", err, body)
	case testutil.ToFloat64(served) != before+1:
		return fmt.Errorf("kubectl logs: %w, but the kubelet API did not answer it", err)
	}
	return nil
}

// The kubelet API keeps its CA across restarts: an API server that
// verifies kubelets with it keeps reaching the virtual nodes after the
// agent restarts, and after the serving certificate is renewed (by the
// same CA, before it expires); the Secret is left as it was.
func TestKubeletAPIKeepsItsCA(t *testing.T) {
	w := newKubeletCAWorld(t)
	before, err := w.cp.Client.CoreV1().Secrets(testAgentNamespace).Get(t.Context(), CASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	api, _, stop := w.start(t, nil)
	if err := w.logsThroughAPIServer(t, api); err != nil {
		t.Fatalf("first start: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The agent restarted, with a serving certificate of 3 s.
	api, reg, _ := w.start(t, func(c *Config) { c.ServingLifetime = 3 * time.Second })
	if err := w.logsThroughAPIServer(t, api); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	first, err := servedLeaf(api)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(first.AuthorityKeyId), w.ca.ID(); got != want {
		t.Errorf("after a restart the serving certificate is signed by %s, want the CA kept, %s", got, want)
	}
	eventually.Within(t, 30*time.Second, "the serving certificate renewed, and the API server reaching the kubelet API with it", func() error {
		leaf, err := servedLeaf(api)
		if err != nil {
			return err
		}
		if leaf.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return errors.New("not renewed yet")
		}
		if leaf.NotBefore.Add(certs.CertBackdate).After(first.NotAfter) {
			t.Errorf("renewed at %s, after the old certificate expired at %s", leaf.NotBefore.Add(certs.CertBackdate), first.NotAfter)
		}
		return w.logsThroughAPIServer(t, api)
	})
	if v, year := offloadtest.ExpiryGauge(t, reg, "kubelet_api", "ca"), DefaultCALifetime.Seconds(); v < year-3600 || v > year {
		t.Errorf("flotilla_certificate_expiry_seconds{cert=ca}: %v, want the CA's remaining life, a year", v)
	}
	if v := offloadtest.ExpiryGauge(t, reg, "kubelet_api", "serving"); v > 3 {
		t.Errorf("flotilla_certificate_expiry_seconds{cert=serving}: %v, want the 3 s certificate's remaining life", v)
	}
	after, err := w.cp.Client.CoreV1().Secrets(testAgentNamespace).Get(t.Context(), CASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(after.Data[certs.CACertKey]) != string(before.Data[certs.CACertKey]) || after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the CA Secret changed across restarts and renewals (resourceVersion %s, was %s)", after.ResourceVersion, before.ResourceVersion)
	}
	if err := api.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

// A permission to the kubelet API revoked stops working once the cached
// answer expires: the caller allowed (the witness), the binding deleted,
// then refused.
func TestKubeletAPIRevokedAfterTTL(t *testing.T) {
	w := newKubeletCAWorld(t)
	api, _, _ := w.start(t, func(c *Config) { c.AuthorizedTTL = 2 * time.Second })
	ctx := t.Context()
	dave := clusterClientCert(t, w.cp, "dave")
	binding := offloadtest.GrantNodesProxy(t, w.cp, "kubelet-logs", "dave", "get")
	path := "/containerLogs/" + appsNS + "/" + caWorldPod + "/server"
	eventually.Within(t, 30*time.Second, "dave allowed (RBAC caught up)", func() error {
		if status, body := kubeletRequest(t, api, &dave, "GET", path, nil); status != http.StatusNotFound {
			return fmt.Errorf("%d %q, want 404 (allowed; the namespace is not offloaded)", status, body)
		}
		return nil
	})
	if err := w.cp.Client.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "dave refused once the binding is gone", func() error {
		if status, body := kubeletRequest(t, api, &dave, "GET", path, nil); status != http.StatusForbidden {
			return fmt.Errorf("%d %q, want 403", status, body)
		}
		return nil
	})
	hits := testutil.ToFloat64(api.m.authCache.WithLabelValues("hit"))
	misses := testutil.ToFloat64(api.m.authCache.WithLabelValues("miss"))
	if misses < 2 {
		t.Errorf("%v reviews asked, want one before and one after the revocation at least", misses)
	}
	t.Logf("authorizations: %v from the cache, %v asked", hits, misses)
}

// With a CA of 15 s and serving certificates of 3 s, the kubelet API
// rotates its CA while clients connect: each trusts the bundle in the
// Secret as it reads it (an operator's copy), and every connection
// verifies; the new CA is in the Secret before it signs, the serving
// certificate moves to it, and the old CA leaves the Secret once expired.
func TestKubeletAPIRotatesItsCA(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	createNamespace(t, cp, testAgentNamespace)
	addr := freeLoopback(t)
	api, err := NewServer(Config{
		Client: cp.Client, Credentials: &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}},
		Address: addr.Addr(), Port: addr.Port(), AgentNamespace: testAgentNamespace,
		CALifetime: 15 * time.Second, ServingLifetime: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runKubeletAPI(t, api)
	secretBundle := func() []byte {
		s, err := cp.Client.CoreV1().Secrets(testAgentNamespace).Get(t.Context(), CASecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Labels["app.kubernetes.io/managed-by"] != "flotilla" {
			t.Fatalf("the CA Secret is not labelled as ours: %v", s.Labels)
		}
		return s.Data[certs.CACertKey]
	}
	seen := offloadtest.NewRotationSeen(t, offloadtest.BundleIDs(t, secretBundle()))
	for conns := 1; ; conns++ {
		bundle := secretBundle()
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(bundle)
		conn, err := tls.Dial("tcp", api.Addr().String(), &tls.Config{RootCAs: roots, ServerName: addr.Addr().String()})
		if err != nil {
			t.Fatalf("connection %d, trusting the Secret's bundle %v: %v", conns, offloadtest.BundleIDs(t, bundle), err)
		}
		leaf := conn.ConnectionState().PeerCertificates[0]
		conn.Close()
		if seen.Observe(t, offloadtest.BundleIDs(t, bundle), hex.EncodeToString(leaf.AuthorityKeyId)) {
			t.Logf("%d connections across the rotation; %v", conns, seen)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
