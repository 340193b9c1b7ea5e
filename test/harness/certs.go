package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// pki is a control plane's certificate authority and the files its
// components read.
type pki struct {
	dir                     string
	caCert, caKey           string
	servingCert, servingKey string
	adminCert, adminKey     string
	saKey, saPub            string
	caPEM, adminCertPEM     []byte
	adminKeyPEM             []byte
	// kubeletClientCert and kubeletClientKey are the API server's
	// credentials towards kubelets (logs, exec, port-forward).
	kubeletClientCert, kubeletClientKey string
	// admissionConfig is the API server's AdmissionConfiguration: it
	// presents the client certificate WebhookClientName to every
	// admission webhook.
	admissionConfig string

	ca       *x509.Certificate
	caSigner *ecdsa.PrivateKey
	mu       sync.Mutex
	serial   int64
}

// newPKI creates a control plane's certificates; the API server's serving
// certificate names loopback and, when valid, lanAddr.
func newPKI(dir string, lanAddr netip.Addr) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "flotilla-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.ca, p.caSigner, p.serial = ca, caKey, 10
	p.caPEM = pemOf("CERTIFICATE", caDER)
	if p.caCert, err = p.write("ca.crt", p.caPEM); err != nil {
		return nil, err
	}
	if p.caKey, err = p.writeKey("ca.key", caKey); err != nil {
		return nil, err
	}
	issue := func(name string, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, fmt.Errorf("%s certificate: %w", name, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pemOf("CERTIFICATE", der), pemOf("EC PRIVATE KEY", keyDER), nil
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if lanAddr.IsValid() {
		ips = append(ips, lanAddr.AsSlice())
	}
	servingCert, servingKey, err := issue("serving", &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses:  ips,
	})
	if err != nil {
		return nil, err
	}
	if p.servingCert, err = p.write("serving.crt", servingCert); err != nil {
		return nil, err
	}
	if p.servingKey, err = p.write("serving.key", servingKey); err != nil {
		return nil, err
	}
	p.adminCertPEM, p.adminKeyPEM, err = issue("admin", &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "flotilla-test-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	if p.adminCert, err = p.write("admin.crt", p.adminCertPEM); err != nil {
		return nil, err
	}
	if p.adminKey, err = p.write("admin.key", p.adminKeyPEM); err != nil {
		return nil, err
	}
	// Like kubeadm's apiserver-kubelet-client: kubelets authorize it by
	// its group.
	kcCert, kcKey, err := p.issueClient("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	if p.kubeletClientCert, err = p.write("apiserver-kubelet-client.crt", kcCert); err != nil {
		return nil, err
	}
	if p.kubeletClientKey, err = p.write("apiserver-kubelet-client.key", kcKey); err != nil {
		return nil, err
	}
	if p.admissionConfig, err = p.writeAdmissionConfig(); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if p.saKey, err = p.writeKey("sa.key", saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if p.saPub, err = p.write("sa.pub", pemOf("PUBLIC KEY", pubDER)); err != nil {
		return nil, err
	}
	return p, nil
}

// WebhookClientName is the common name of the client certificate every
// harness API server presents to admission webhooks, signed by its CA
// (ControlPlane.CA).
const WebhookClientName = "kube-apiserver-webhook-client"

// writeAdmissionConfig writes the AdmissionConfiguration that has the API
// server present a client certificate to every admission webhook, as an
// operator configures it for webhooks that require one
// (docs/offload.md shows the same files).
func (p *pki) writeAdmissionConfig() (string, error) {
	cert, key, err := p.issueClient(WebhookClientName)
	if err != nil {
		return "", err
	}
	certFile, err := p.write("webhook-client.crt", cert)
	if err != nil {
		return "", err
	}
	keyFile, err := p.write("webhook-client.key", key)
	if err != nil {
		return "", err
	}
	kubeconfig, err := p.write("webhook-client.kubeconfig", []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: %s
    client-key: %s
`, certFile, keyFile)))
	if err != nil {
		return "", err
	}
	var plugins string
	for _, plugin := range []string{"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"} {
		plugins += fmt.Sprintf(`- name: %s
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %s
`, plugin, kubeconfig)
	}
	return p.write("admission.yaml", []byte("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n"+plugins))
}

// issueClient issues a client certificate for user cn in groups.
func (p *pki) issueClient(cn string, groups ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	p.serial++
	serial := p.serial
	p.mu.Unlock()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn, Organization: groups},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caSigner)
	if err != nil {
		return nil, nil, fmt.Errorf("%s certificate: %w", cn, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemOf("CERTIFICATE", der), pemOf("EC PRIVATE KEY", keyDER), nil
}

func pemOf(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func (p *pki) write(name string, data []byte) (string, error) {
	path := filepath.Join(p.dir, name)
	return path, os.WriteFile(path, data, 0o600)
}

func (p *pki) writeKey(name string, key *ecdsa.PrivateKey) (string, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	return p.write(name, pemOf("EC PRIVATE KEY", der))
}
