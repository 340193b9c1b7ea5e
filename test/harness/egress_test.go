package harness_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The API server calls a webhook by URL at an address inside a site (as
// an agent in the host network of its gateway serves one), once told to
// reach into the site: from the host's namespace, where it runs, that
// address is not even routed.
func TestAPIServerCallsAWebhookInASite(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	site := env.NewSite("a", harness.SiteOptions{LAN: env.NewLAN("lan")})
	cp.ReachInto(site.Netns, netip.PrefixFrom(site.Addr, 32))

	cert, caPEM := selfSigned(t, site.Addr)
	l, err := site.Listen("tcp", netip.AddrPortFrom(site.Addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var review admissionv1.AdmissionReview
			if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
				http.Error(w, "bad review", http.StatusBadRequest)
				return
			}
			review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Result: &metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusForbidden, Message: "refused from inside site " + site.SiteName}}
			review.Request = nil
			json.NewEncoder(w).Encode(review)
		}),
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })

	url := "https://" + l.Addr().String() + "/"
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "site-webhook"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "site.flotilla.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"webhook": "site"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	ctx := t.Context()
	if _, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hooked", Labels: map[string]string{"webhook": "site"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 60*time.Second, "the webhook in the site refuses a ConfigMap", func() error {
		_, err := cp.Client.CoreV1().ConfigMaps("hooked").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "refused from inside site a") {
			return fmt.Errorf("created: %v", err)
		}
		return nil
	})
}

// selfSigned is a certificate for addr and its PEM, its own CA.
func selfSigned(t *testing.T, addr netip.Addr) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "site webhook"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{addr.AsSlice()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
