package kubeletapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestKubeletAPIServingCertificate: the serving certificate names the
// address the virtual nodes register, and no other (the API server
// refuses any other), and every virtual node; it is renewed before it
// expires and when a virtual node comes, each time by the same authority.
func TestKubeletAPIServingCertificate(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	addr := freeLoopback(t)
	createNamespace(t, cp, testAgentNamespace)
	api, err := NewServer(Config{
		Client: cp.Client, Credentials: &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}},
		Address: addr.Addr(), Port: addr.Port(), AgentNamespace: testAgentNamespace,
		CALifetime: time.Hour, ServingLifetime: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runKubeletAPI(t, api)

	first, err := servedLeaf(api)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(api.CA())
	verify := func(leaf *x509.Certificate, name string) error {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, CurrentTime: leaf.NotBefore.Add(certs.CertBackdate)})
		return err
	}
	if err := verify(first, addr.Addr().String()); err != nil {
		t.Errorf("the serving certificate for its address %s: %v", addr.Addr(), err)
	}
	if err := verify(first, "127.0.0.1"); err == nil {
		t.Errorf("the serving certificate is valid for 127.0.0.1 too (IPs %v); only %s is registered", first.IPAddresses, addr.Addr())
	}

	provider := offloadtest.NewConsumer(t)
	for name, labels := range map[string]map[string]string{
		offload.VirtualNodeName(provider): {offload.LabelVirtualNode: "true"},
		"worker":                          nil,
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		if _, err := cp.Client.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var named *x509.Certificate
	eventually.Within(t, 10*time.Second, "a certificate naming the new virtual node", func() error {
		leaf, err := servedLeaf(api)
		if err != nil {
			return err
		}
		if len(leaf.DNSNames) == 0 {
			return fmt.Errorf("DNS names %v", leaf.DNSNames)
		}
		named = leaf
		return nil
	})
	if want := []string{offload.VirtualNodeName(provider)}; !slicesEqual(named.DNSNames, want) {
		t.Errorf("DNS names %v, want %v (virtual nodes only)", named.DNSNames, want)
	}
	if err := verify(named, offload.VirtualNodeName(provider)); err != nil {
		t.Errorf("the serving certificate for the virtual node's name: %v", err)
	}
	// Renewed at two thirds of its 3 s.
	eventually.Within(t, 10*time.Second, "the certificate renewed", func() error {
		leaf, err := servedLeaf(api)
		if err != nil {
			return err
		}
		if leaf.SerialNumber.Cmp(named.SerialNumber) == 0 {
			return errors.New("still the same")
		}
		if err := verify(leaf, addr.Addr().String()); err != nil {
			return fmt.Errorf("the renewed certificate: %w", err)
		}
		if !slicesEqual(leaf.DNSNames, named.DNSNames) {
			return fmt.Errorf("the renewed certificate names %v", leaf.DNSNames)
		}
		return nil
	})
}

func slicesEqual(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// kubeletRequest makes one request of the kubelet API, verifying its
// certificate, with cert as the client's (nil: none).
func kubeletRequest(t *testing.T, api *Server, cert *tls.Certificate, method, path string, header http.Header) (int, string) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(api.CA())
	cfg := &tls.Config{RootCAs: roots}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "https://"+api.Addr().String()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body)
}

// servedLeaf is the certificate the kubelet API serves, once it serves.
func servedLeaf(api *Server) (*x509.Certificate, error) {
	conn, err := tls.Dial("tcp", api.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// freeLoopback is a free port on a loopback address of its own (127/8 is
// all loopback on Linux): a certificate for 127.0.0.1 would not do there.
func freeLoopback(t *testing.T) netip.AddrPort {
	t.Helper()
	addr := netip.AddrFrom4([4]byte{127, byte(1 + mrand.IntN(254)), byte(mrand.IntN(256)), byte(1 + mrand.IntN(254))})
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return netip.MustParseAddrPort(l.Addr().String())
}

// clientCertOf is a client certificate for user in groups from ca.
func clientCertOf(t *testing.T, ca *certs.CertAuthority, user string, groups ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: certs.Serial(), Subject: pkix.Name{CommonName: user, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// clusterClientCert is a client certificate for user signed by cp's own
// client CA: a CertificateSigningRequest the admin approves and the
// controller manager signs.
func clusterClientCert(t *testing.T, cp *harness.ControlPlane, user string) tls.Certificate {
	t.Helper()
	ctx := t.Context()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: user}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrs := cp.Client.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelet-api-" + user},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "a user of the test"})
	if _, err := csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var signed []byte
	eventually.Within(t, 30*time.Second, "the certificate of "+user+" signed", func() error {
		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if signed = got.Status.Certificate; len(signed) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(signed, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// testAgentNamespace holds the CA Secrets in tests, as flotilla-system
// does in a cluster.
const testAgentNamespace = "flotilla-system"

func createNamespace(t *testing.T, cp *harness.ControlPlane, name string) {
	t.Helper()
	_, err := cp.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// seedKubeletCA puts ca in the kubelet API's CA Secret of cp, in the
// agent's namespace, as an operator who brings the CA an API server was
// started to trust does.
func seedKubeletCA(t *testing.T, cp *harness.ControlPlane, ca *certs.CertAuthority) {
	t.Helper()
	createNamespace(t, cp, testAgentNamespace)
	data, err := certs.CASet{ca}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: CASecret, Namespace: testAgentNamespace}, Data: data}
	if _, err := cp.Client.CoreV1().Secrets(testAgentNamespace).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
