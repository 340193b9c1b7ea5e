package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// The certificates of the agent's two servers the API server calls, the
// placement webhook and the virtual nodes' kubelet API (docs/offload.md,
// "Certificates"). For each the agent is its own CA: the API server
// trusts that server's CAs and nothing else, and the CAs live in a Secret
// of the agent's namespace (CAStore) so that a restarted agent serves
// what the API server already trusts. This file is the certificates
// themselves; castore.go keeps and rotates them.
const (
	// DefaultWebhookCALifetime is a CA's; a successor is made when a
	// third of it is left, and both are in the caBundle until the old
	// one expires: four months of overlap.
	DefaultWebhookCALifetime = 365 * 24 * time.Hour
	// DefaultWebhookServingLifetime is a serving certificate's; it is
	// renewed when a third of it is left (10 days), and at once when a
	// newer CA has been trusted for DefaultWebhookCAPublishDelay. It is
	// kept in memory only: a restarted agent issues a new one.
	DefaultWebhookServingLifetime = 30 * 24 * time.Hour
	// DefaultWebhookCAPublishDelay is how long a new CA sits in the
	// caBundle before it signs: API servers read webhook configurations
	// from a watch, which lags by far less than this.
	DefaultWebhookCAPublishDelay = time.Minute
	// CertBackdate starts every certificate's validity this much before
	// it was made, for API servers whose clocks are a little behind.
	CertBackdate = 5 * time.Minute
)

// CertLifetimes are the lifetimes in force (the defaults, or a test's).
type CertLifetimes struct {
	CA, Serving, Publish time.Duration
}

func (l CertLifetimes) Validate() error {
	switch {
	case l.CA <= 0 || l.Serving <= 0 || l.Publish <= 0:
		return errors.New("certificate lifetimes and the CA publish delay must be positive")
	case l.Serving > l.CA/3:
		return fmt.Errorf("the serving certificate lifetime %s exceeds a third of the CA lifetime %s: a CA would be replaced before the certificates it signs", l.Serving, l.CA)
	case l.Publish >= l.CA/3:
		// A new CA is made when a third of the old one's life is left; it
		// must sign before the old one expires.
		return fmt.Errorf("the CA publish delay %s is not shorter than a third of the CA lifetime %s: the old CA would expire before the new one signs", l.Publish, l.CA)
	}
	return nil
}

// CertAuthority is one CA of a server of the agent.
type CertAuthority struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// ID names a CA in logs and in the set of published ones.
func (ca *CertAuthority) ID() string { return hex.EncodeToString(ca.Cert.SubjectKeyId) }

// Made is when the CA was made (its validity starts CertBackdate
// before): it was published no earlier.
func (ca *CertAuthority) Made() time.Time { return ca.Cert.NotBefore.Add(CertBackdate) }

// PEM is the CA's certificate, PEM.
func (ca *CertAuthority) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// CASet is a server's CAs, oldest first; the newest signs once
// published (Signer).
type CASet []*CertAuthority

// Newest is the last CA, nil when there is none.
func (s CASet) Newest() *CertAuthority {
	if len(s) == 0 {
		return nil
	}
	return s[len(s)-1]
}

// Rotated drops the CAs that expired by now and adds a new one when the
// newest has less than a third of lifetime left (or there is none).
func (s CASet) Rotated(name string, now time.Time, lifetime time.Duration) (CASet, bool, error) {
	var out CASet
	for _, ca := range s {
		if ca.Cert.NotAfter.After(now) {
			out = append(out, ca)
		}
	}
	changed := len(out) != len(s)
	if n := out.Newest(); n == nil || n.Cert.NotAfter.Sub(now) < lifetime/3 {
		ca, err := NewCA(name, now, lifetime)
		if err != nil {
			return s, false, err
		}
		out = append(out, ca)
		changed = true
	}
	return out, changed, nil
}

// RotateAt is when Rotated next changes the set: the newest CA's
// rotation point or the first expiry.
func (s CASet) RotateAt(lifetime time.Duration) time.Time {
	n := s.Newest()
	if n == nil {
		return time.Time{}
	}
	at := n.Cert.NotAfter.Add(-lifetime / 3)
	for _, ca := range s {
		if ca.Cert.NotAfter.Before(at) {
			at = ca.Cert.NotAfter
		}
	}
	return at
}

// Bundle is the caBundle: every CA's certificate, PEM.
func (s CASet) Bundle() []byte {
	var b bytes.Buffer
	for _, ca := range s {
		b.Write(ca.PEM())
	}
	return b.Bytes()
}

// Keys of the CA Secret's data.
const (
	CACertKey = "ca.crt"
	CAKeyKey  = "ca.key"
)

// Encode is the CA Secret's data: the certificates and their keys, in
// the same order.
func (s CASet) Encode() (map[string][]byte, error) {
	var keys bytes.Buffer
	for _, ca := range s {
		der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
		if err != nil {
			return nil, fmt.Errorf("encode the key of CA %s: %w", ca.ID(), err)
		}
		pem.Encode(&keys, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	return map[string][]byte{CACertKey: s.Bundle(), CAKeyKey: keys.Bytes()}, nil
}

// DecodeCAs reads what Encode wrote; each certificate must be a CA with
// the key after it.
func DecodeCAs(data map[string][]byte) (CASet, error) {
	certs, err := pemBlocks(data[CACertKey], "CERTIFICATE")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CACertKey, err)
	}
	keys, err := pemBlocks(data[CAKeyKey], "PRIVATE KEY")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CAKeyKey, err)
	}
	if len(certs) == 0 || len(certs) != len(keys) {
		return nil, fmt.Errorf("%d certificates and %d keys; want as many of each, at least one", len(certs), len(keys))
	}
	var s CASet
	for i := range certs {
		cert, err := x509.ParseCertificate(certs[i])
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", i+1, err)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("certificate %d is not a CA", i+1)
		}
		k, err := x509.ParsePKCS8PrivateKey(keys[i])
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i+1, err)
		}
		key, ok := k.(*ecdsa.PrivateKey)
		if !ok || !key.PublicKey.Equal(cert.PublicKey) {
			return nil, fmt.Errorf("key %d is not the key of certificate %d", i+1, i+1)
		}
		s = append(s, &CertAuthority{Cert: cert, Key: key})
	}
	return s, nil
}

func pemBlocks(data []byte, typ string) ([][]byte, error) {
	var out [][]byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != typ {
			return nil, fmt.Errorf("a PEM block of type %s, want %s", b.Type, typ)
		}
		out = append(out, b.Bytes)
	}
	if len(bytes.TrimSpace(data)) > 0 {
		return nil, errors.New("data that is not PEM")
	}
	return out, nil
}

// NewCA makes a CA named after its server (name) and when it was made:
// two CAs of one server, side by side in a bundle, read apart.
func NewCA(name string, now time.Time, lifetime time.Duration) (*CertAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          Serial(),
		Subject:               pkix.Name{CommonName: name + " CA " + now.UTC().Format(time.RFC3339)},
		NotBefore:             now.Add(-CertBackdate),
		NotAfter:              now.Add(lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		// SubjectKeyId: made by x509 from the key, as for every CA.
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CertAuthority{Cert: cert, Key: key}, nil
}

// ServingCert is the certificate a server serves and when to renew it.
type ServingCert struct {
	TLS     *tls.Certificate
	issuer  string // the id of the CA that signed it
	RenewAt time.Time
}

// IssueServing signs a serving certificate of the server name for hosts
// (IP addresses or DNS names) with ca, valid for lifetime but never past
// ca; it is renewed at two thirds of its validity.
func IssueServing(ca *CertAuthority, name string, hosts []string, now time.Time, lifetime time.Duration) (*ServingCert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("serving key: %w", err)
	}
	notAfter := now.Add(lifetime)
	if ca.Cert.NotAfter.Before(notAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: Serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-CertBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &ServingCert{
		TLS:     &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		issuer:  ca.ID(),
		RenewAt: now.Add(notAfter.Sub(now) * 2 / 3),
	}, nil
}

// Signer is the CA that signs the next serving certificate: the newest
// one that has been published for publish (published holds when each
// CA was published to whoever must trust it), else the newest one
// (nothing older is left).
func (s CASet) Signer(published map[string]time.Time, now time.Time, publish time.Duration) *CertAuthority {
	for i := len(s) - 1; i >= 0; i-- {
		if at, ok := published[s[i].ID()]; ok && !now.Before(at.Add(publish)) {
			return s[i]
		}
	}
	return s.Newest()
}

func Serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
