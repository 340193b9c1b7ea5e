package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A client certificate is taken only when it chains, for client
// authentication, to the CA as the cluster's ConfigMap last said it: a
// CA removed there is no longer trusted, a ConfigMap without a usable
// bundle leaves the one held, and nothing is trusted before the first.
func TestClientCA(t *testing.T) {
	now := time.Now()
	cluster, err := NewCA("cluster", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	apiServer := clientOf(t, cluster, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)
	server := clientOf(t, cluster, "a serving certificate", x509.ExtKeyUsageServerAuth)
	stranger := clientOf(t, other, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)
	configMap := func(bundle string) *corev1.ConfigMap {
		return &corev1.ConfigMap{Data: map[string]string{ClusterClientCAKey: bundle}}
	}

	ca := &ClientCA{Name: "test", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if _, err := ca.Verify(apiServer); err == nil {
		t.Error("a certificate taken before the CA was known")
	}
	if _, err := ca.Verify(&tls.ConnectionState{}); !errors.Is(err, ErrNoClientCertificate) {
		t.Errorf("no certificate: %v, want ErrNoClientCertificate", err)
	}
	ca.SetFrom(configMap(string(cluster.PEM())))
	for _, tc := range []struct {
		what  string
		state *tls.ConnectionState
		ok    bool
	}{
		{"the API server's", apiServer, true},
		{"one for serving, of the same CA", server, false},
		{"one of another CA, named as the API server's", stranger, false},
	} {
		leaf, err := ca.Verify(tc.state)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want taken %v", tc.what, err, tc.ok)
		}
		if tc.ok && err == nil && leaf.Subject.CommonName != "kube-apiserver-webhook-client" {
			t.Errorf("%s: leaf %q", tc.what, leaf.Subject.CommonName)
		}
	}
	ca.SetFrom(configMap("not a certificate"))
	if _, err := ca.Verify(apiServer); err != nil {
		t.Errorf("an unusable bundle dropped the CA held: %v", err)
	}
	ca.SetFrom(configMap(string(other.PEM())))
	if _, err := ca.Verify(apiServer); err == nil {
		t.Error("a CA removed from the ConfigMap still trusted")
	}
	if _, err := ca.Verify(stranger); err != nil {
		t.Errorf("the CA added: %v", err)
	}

	if _, err := NewClientCA("test", []byte("not a certificate")); err == nil {
		t.Error("a bundle without a certificate accepted")
	}
	fixed, err := NewClientCA("test", cluster.PEM())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fixed.Verify(apiServer); err != nil {
		t.Errorf("a fixed bundle: %v", err)
	}
}

// clientOf is a connection presenting a certificate named cn for usage,
// signed by ca.
func clientOf(t *testing.T, ca *CertAuthority, cn string, usage x509.ExtKeyUsage) *tls.ConnectionState {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
}
