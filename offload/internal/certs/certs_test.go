package certs

import (
	"bytes"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

// The CA schedule over a year and a half with the default lifetimes: one
// CA until a third of its life is left, then two until the old one
// expires, then the new one alone.
func TestCARotationSchedule(t *testing.T) {
	year := DefaultWebhookCALifetime
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cas, changed, err := CASet(nil).Rotated("test", start, year)
	if err != nil || !changed || len(cas) != 1 {
		t.Fatalf("first CA: %d CAs, changed %v, %v", len(cas), changed, err)
	}
	first := cas[0]
	if got := first.Cert.NotAfter; !got.Equal(start.Add(year)) {
		t.Errorf("first CA until %s, want %s", got, start.Add(year))
	}
	rotate := start.Add(year - year/3)
	if at := cas.RotateAt(year); !at.Equal(rotate) {
		t.Errorf("rotation at %s, want %s", at, rotate)
	}
	for _, step := range []struct {
		at   time.Time
		want int // CAs after
		new  bool
	}{
		{start.Add(time.Hour), 1, false},
		{rotate.Add(-time.Second), 1, false},
		{rotate.Add(time.Second), 2, true},
		{start.Add(year).Add(-time.Second), 2, false},
		{start.Add(year).Add(time.Second), 1, false},
	} {
		var c bool
		cas, c, err = cas.Rotated("test", step.at, year)
		if err != nil {
			t.Fatal(err)
		}
		if len(cas) != step.want || (c && step.new && cas.Newest() == first) {
			t.Fatalf("at %s: %d CAs (changed %v), want %d", step.at, len(cas), c, step.want)
		}
	}
	if cas[0] == first {
		t.Errorf("the first CA outlived its expiry")
	}
	if _, c, _ := cas.Rotated("test", start.Add(year).Add(2*time.Second), year); c {
		t.Errorf("nothing to do, yet changed")
	}
}

// A new CA signs only once it has been in the caBundle long enough; the
// serving certificate it signs is valid for the API server that trusts
// the bundle, names the address, and never outlives its CA.
func TestServingCertificate(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	old, err := NewCA("test", now.Add(-300*24*time.Hour), DefaultWebhookCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := NewCA("test", now, DefaultWebhookCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	cas := CASet{old, fresh}
	published := map[string]time.Time{old.ID(): {}, fresh.ID(): now}
	if s := cas.Signer(published, now.Add(30*time.Second), time.Minute); s != old {
		t.Errorf("a CA published 30 s ago signs; want the old one until a minute has passed")
	}
	if s := cas.Signer(published, now.Add(time.Minute), time.Minute); s != fresh {
		t.Errorf("the new CA does not sign after a minute")
	}
	if s := cas.Signer(map[string]time.Time{}, now, time.Minute); s != fresh {
		t.Errorf("with nothing published (a first start), the newest signs")
	}

	// Signed by the old CA, 65 days before it expires: capped by it.
	s, err := IssueServing(old, "test", []string{"192.0.2.7", "agent.example"}, now, 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := s.TLS.Leaf
	if !leaf.NotAfter.Equal(old.Cert.NotAfter) {
		t.Errorf("serving certificate until %s, past its CA's %s", leaf.NotAfter, old.Cert.NotAfter)
	}
	if want := now.Add(old.Cert.NotAfter.Sub(now) * 2 / 3); !s.RenewAt.Equal(want) {
		t.Errorf("renewal at %s, want two thirds of its life, %s", s.RenewAt, want)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cas.Bundle())
	for _, host := range []string{"192.0.2.7", "agent.example"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify for %s against the bundle: %v", host, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "192.0.2.8", CurrentTime: now}); err == nil {
		t.Errorf("the certificate is valid for an address it does not name")
	}
	// Valid from a little before it was made: an API server whose clock
	// is behind accepts it.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "192.0.2.7", CurrentTime: now.Add(-time.Minute)}); err != nil {
		t.Errorf("a minute behind: %v", err)
	}
}

// What the Secret holds reads back; what it should not hold is refused
// with a reason.
func TestCASecretEncoding(t *testing.T) {
	now := time.Now()
	a, _ := NewCA("test", now, time.Hour)
	b, _ := NewCA("test", now, 2*time.Hour)
	data, err := CASet{a, b}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeCAs(data)
	if err != nil || len(back) != 2 || back[0].ID() != a.ID() || back[1].ID() != b.ID() || !back[1].Key.Equal(b.Key) {
		t.Fatalf("decoded %d CAs, %v", len(back), err)
	}
	swapped, _ := CASet{b, a}.Encode()
	leaf, _ := IssueServing(a, "test", []string{"192.0.2.7"}, now, time.Minute)
	for name, tc := range map[string]struct {
		data map[string][]byte
		want string
	}{
		"empty":                 {map[string][]byte{}, "0 certificates and 0 keys"},
		"a key missing":         {map[string][]byte{CACertKey: data[CACertKey], CAKeyKey: swapped[CAKeyKey][:bytes.Index(swapped[CAKeyKey][1:], []byte("-----BEGIN"))+1]}, "2 certificates and 1 keys"},
		"keys of other CAs":     {map[string][]byte{CACertKey: data[CACertKey], CAKeyKey: swapped[CAKeyKey]}, "key 1 is not the key of certificate 1"},
		"not PEM":               {map[string][]byte{CACertKey: []byte("hello"), CAKeyKey: data[CAKeyKey]}, "not PEM"},
		"a key as a cert":       {map[string][]byte{CACertKey: data[CAKeyKey], CAKeyKey: data[CAKeyKey]}, "PRIVATE KEY, want CERTIFICATE"},
		"a serving certificate": {map[string][]byte{CACertKey: pemCert(leaf.TLS.Leaf), CAKeyKey: data[CAKeyKey][:bytes.Index(data[CAKeyKey][1:], []byte("-----BEGIN"))+1]}, "not a CA"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeCAs(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// Lifetimes that would let a CA go before what it signed are refused.
func TestCertLifetimesValidate(t *testing.T) {
	for _, l := range []CertLifetimes{
		{CA: time.Hour, Serving: 30 * time.Minute, Publish: time.Minute},
		{CA: time.Hour, Serving: 10 * time.Minute, Publish: 20 * time.Minute},
		{CA: 0, Serving: time.Minute, Publish: time.Second},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("lifetimes %+v accepted", l)
		}
	}
	if err := (CertLifetimes{CA: DefaultWebhookCALifetime, Serving: DefaultWebhookServingLifetime, Publish: DefaultWebhookCAPublishDelay}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// Whatever a CA Secret holds (edited by hand), DecodeCAs returns CAs
// whose keys match their certificates, or an error; it never panics.
func FuzzDecodeCAs(f *testing.F) {
	a, _ := NewCA("test", time.Now(), time.Hour)
	data, _ := CASet{a}.Encode()
	f.Add(data[CACertKey], data[CAKeyKey])
	f.Add([]byte("hello"), data[CAKeyKey])
	f.Add(data[CAKeyKey], data[CACertKey])
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, pems, keys []byte) {
		cas, err := DecodeCAs(map[string][]byte{CACertKey: pems, CAKeyKey: keys})
		if err != nil {
			return
		}
		for _, ca := range cas {
			if !ca.Cert.IsCA || !ca.Key.PublicKey.Equal(ca.Cert.PublicKey) {
				t.Fatalf("CA %s accepted without being a CA with its key", ca.ID())
			}
		}
	})
}

func pemCert(c *x509.Certificate) []byte {
	return CASet{{Cert: c}}.Bundle()
}
