package offload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Lifetimes of the kubelet API's certificates. The serving certificate is
// renewed at two thirds of its life; the authority lives longer, and is
// replaced only when it would expire before the next serving certificate.
const (
	servingCertLifetime = 7 * 24 * time.Hour
	kubeletCALifetime   = 365 * 24 * time.Hour
)

// kubeletCA is the small authority of the kubelet API: it signs the
// serving certificates, so that whoever trusts it keeps trusting them
// across renewals.
type kubeletCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newKubeletCA(now time.Time) (*kubeletCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "flotilla virtual nodes CA"},
		NotBefore:             now.Add(-certBackdate),
		NotAfter:              now.Add(kubeletCALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("kubelet API: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &kubeletCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// servingCerts holds the kubelet API's serving certificate: it names the
// address the virtual nodes register as their InternalIP, which is the
// address the API server dials and verifies (a certificate for any other
// address fails there: liqotech/liqo #1334), and the virtual nodes' names.
type servingCerts struct {
	addr     netip.Addr
	lifetime time.Duration

	mu      sync.Mutex
	ca      *kubeletCA
	names   []string // DNS names, sorted
	current *tls.Certificate
	leaf    *x509.Certificate
}

func newServingCerts(addr netip.Addr, ca *kubeletCA, lifetime time.Duration) *servingCerts {
	return &servingCerts{addr: addr, ca: ca, lifetime: lifetime}
}

// get is the server's tls.Config.GetCertificate.
func (s *servingCerts) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return nil, fmt.Errorf("kubelet API: no serving certificate yet")
	}
	return s.current, nil
}

// caPEM is the authority that signs the serving certificates, PEM.
func (s *servingCerts) caPEM() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ca.pem
}

// setNames records the DNS names to serve; true when they changed.
func (s *servingCerts) setNames(names []string) bool {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(names, s.names) {
		return false
	}
	s.names = names
	return true
}

// renewAt is when the current certificate is due for renewal (now when
// there is none).
func (s *servingCerts) renewAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaf == nil {
		return time.Time{}
	}
	issued := s.leaf.NotBefore.Add(certBackdate)
	return issued.Add(s.lifetime * 2 / 3)
}

// issue makes a new serving certificate for the address and the names,
// and a new authority first when the current one would expire before it.
func (s *servingCerts) issue(now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	notAfter := now.Add(s.lifetime)
	if s.ca == nil || s.ca.cert.NotAfter.Before(notAfter) {
		ca, err := newKubeletCA(now)
		if err != nil {
			return err
		}
		s.ca = ca
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "flotilla virtual nodes"},
		NotBefore:    now.Add(-certBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{s.addr.AsSlice()},
		DNSNames:     s.names,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca.cert, &key.PublicKey, s.ca.key)
	if err != nil {
		return fmt.Errorf("kubelet API: serving certificate for %s: %w", s.addr, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	s.current = &tls.Certificate{Certificate: [][]byte{der, s.ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	s.leaf = leaf
	return nil
}
