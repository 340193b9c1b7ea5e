package grant

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/identity"
)

// secret is the token of every test grant; long enough that finding it in
// an output means it leaked.
var secret = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2VuLW9mLXRoZS1jb25zdW1lcg.SIGNATURE-" + strings.Repeat("x7", 40)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

var (
	caOnce sync.Once
	caPEM  []byte
)

// testCA is a self-signed CA certificate in PEM.
func testCA(t testing.TB) []byte {
	t.Helper()
	caOnce.Do(func() {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
			NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
		if err != nil {
			panic(err)
		}
		caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	})
	return append([]byte(nil), caPEM...)
}

func newID(t testing.TB) identity.Identity {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// sample is a valid grant from provider to consumer.
func sample(t testing.TB, provider, consumer identity.Identity, serial uint64) Grant {
	return Grant{
		Provider: provider.ClusterID(), Consumer: consumer.ClusterID(), Serial: serial,
		IssuedAt: t0, ExpiresAt: t0.Add(time.Hour),
		Server: "https://198.18.0.10:6443", CAData: testCA(t), Token: NewToken(secret),
		Namespace: "flotilla-tenant-" + consumer.ClusterID(),
		Limits:    Limits{CPU: "4", Memory: "8Gi", Pods: 20, Namespaces: 3},
	}
}

func revocation(provider, consumer identity.Identity, serial uint64) Grant {
	return Grant{Provider: provider.ClusterID(), Consumer: consumer.ClusterID(), Serial: serial, Revoked: true}
}

func mustSeal(t testing.TB, provider identity.Identity, consumer ed25519.PublicKey, g Grant) []byte {
	t.Helper()
	b, err := Seal(provider, consumer, g)
	if err != nil {
		t.Fatalf("Seal: %s", safe(err))
	}
	return b
}

// sealWire seals a grant's wire form as given, unchecked: what a provider
// with other code (or a bug) could send.
func sealWire(t testing.TB, provider identity.Identity, consumer ed25519.PublicKey, fields map[string]any) []byte {
	t.Helper()
	payload, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	b, err := provider.SealFor(consumer, Purpose, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wireFields is g's wire form as a map, to change before sealWire.
func wireFields(t testing.TB, g Grant) map[string]any {
	t.Helper()
	if g.Version == 0 {
		g.Version = Version
	}
	b, err := json.Marshal(wire{
		Version: g.Version, Provider: g.Provider, Consumer: g.Consumer, Serial: g.Serial, Revoked: g.Revoked,
		IssuedAt: g.IssuedAt, ExpiresAt: g.ExpiresAt, Server: g.Server, CA: string(g.CAData),
		Token: g.Token.Reveal(), Namespace: g.Namespace, Limits: g.Limits,
	})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// safe is an error's message for a test failure, checked not to carry the
// token (a failure message is output too).
func safe(err error) string {
	if err == nil {
		return "<nil>"
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), secret[:20]) {
		return "AN ERROR MESSAGE CARRIES THE TOKEN"
	}
	return err.Error()
}

// noToken fails when s shows the token.
func noToken(t testing.TB, what, s string) {
	t.Helper()
	if strings.Contains(s, secret[:20]) {
		t.Errorf("%s shows the token (%d bytes of output)", what, len(s))
	}
}
