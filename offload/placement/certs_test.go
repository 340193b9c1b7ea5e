package placement

import (
	"bytes"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/offload/internal/certs"
	"github.com/flotilla-io/flotilla/offload/kubeletapi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"
)

// The CA schedule over a year and a half with the default lifetimes: one
// CA until a third of its life is left, then two until the old one
// expires, then the new one alone.
func TestCARotationSchedule(t *testing.T) {
	year := certs.DefaultWebhookCALifetime
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cas, changed, err := certs.CASet(nil).Rotated("test", start, year)
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
	old, err := certs.NewCA("test", now.Add(-300*24*time.Hour), certs.DefaultWebhookCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := certs.NewCA("test", now, certs.DefaultWebhookCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	cas := certs.CASet{old, fresh}
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
	s, err := certs.IssueServing(old, "test", []string{"192.0.2.7", "agent.example"}, now, 90*24*time.Hour)
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
	a, _ := certs.NewCA("test", now, time.Hour)
	b, _ := certs.NewCA("test", now, 2*time.Hour)
	data, err := certs.CASet{a, b}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := certs.DecodeCAs(data)
	if err != nil || len(back) != 2 || back[0].ID() != a.ID() || back[1].ID() != b.ID() || !back[1].Key.Equal(b.Key) {
		t.Fatalf("decoded %d CAs, %v", len(back), err)
	}
	swapped, _ := certs.CASet{b, a}.Encode()
	leaf, _ := certs.IssueServing(a, "test", []string{"192.0.2.7"}, now, time.Minute)
	for name, tc := range map[string]struct {
		data map[string][]byte
		want string
	}{
		"empty":                 {map[string][]byte{}, "0 certificates and 0 keys"},
		"a key missing":         {map[string][]byte{certs.CACertKey: data[certs.CACertKey], certs.CAKeyKey: swapped[certs.CAKeyKey][:bytes.Index(swapped[certs.CAKeyKey][1:], []byte("-----BEGIN"))+1]}, "2 certificates and 1 keys"},
		"keys of other CAs":     {map[string][]byte{certs.CACertKey: data[certs.CACertKey], certs.CAKeyKey: swapped[certs.CAKeyKey]}, "key 1 is not the key of certificate 1"},
		"not PEM":               {map[string][]byte{certs.CACertKey: []byte("hello"), certs.CAKeyKey: data[certs.CAKeyKey]}, "not PEM"},
		"a key as a cert":       {map[string][]byte{certs.CACertKey: data[certs.CAKeyKey], certs.CAKeyKey: data[certs.CAKeyKey]}, "PRIVATE KEY, want CERTIFICATE"},
		"a serving certificate": {map[string][]byte{certs.CACertKey: pemCert(leaf.TLS.Leaf), certs.CAKeyKey: data[certs.CAKeyKey][:bytes.Index(data[certs.CAKeyKey][1:], []byte("-----BEGIN"))+1]}, "not a CA"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := certs.DecodeCAs(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func pemCert(c *x509.Certificate) []byte {
	return certs.CASet{{Cert: c}}.Bundle()
}

// Lifetimes that would let a CA go before what it signed are refused.
func TestCertLifetimesValidate(t *testing.T) {
	for _, l := range []certs.CertLifetimes{
		{CA: time.Hour, Serving: 30 * time.Minute, Publish: time.Minute},
		{CA: time.Hour, Serving: 10 * time.Minute, Publish: 20 * time.Minute},
		{CA: 0, Serving: time.Minute, Publish: time.Second},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("lifetimes %+v accepted", l)
		}
	}
	if err := (certs.CertLifetimes{CA: certs.DefaultWebhookCALifetime, Serving: certs.DefaultWebhookServingLifetime, Publish: certs.DefaultWebhookCAPublishDelay}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// What is not an AdmissionReview is answered 400 and counted, before
// anything is read from the cluster.
func TestPlacementWebhookRefusesBadReviews(t *testing.T) {
	reg := prometheus.NewRegistry()
	w, err := NewWebhook(WebhookConfig{
		Config: &rest.Config{Host: "https://127.0.0.1:1"}, Address: mustAddr("127.0.0.1"), AgentNamespace: "flotilla-system",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"", "{", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`} {
		rec := httptest.NewRecorder()
		w.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, placementPath, strings.NewReader(body)))
		if rec.Code != http.StatusBadRequest {
			t.Errorf("body %q: %d, want 400", body, rec.Code)
		}
	}
	rec := httptest.NewRecorder()
	w.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, placementPath, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", rec.Code)
	}
	if got := testutil.ToFloat64(w.requests.WithLabelValues(resultError)); got != 3 {
		t.Errorf("errors counted %v, want 3", got)
	}
}

// Addresses the API server cannot call, and URLs it would not accept,
// are refused before anything starts.
func TestPlacementWebhookConfigRefused(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	for name, c := range map[string]WebhookConfig{
		"no address":          {Config: cfg, AgentNamespace: "x"},
		"unspecified address": {Config: cfg, Address: mustAddr("0.0.0.0"), AgentNamespace: "x"},
		"no namespace":        {Config: cfg, Address: mustAddr("192.0.2.7")},
		"http URL":            {Config: cfg, Address: mustAddr("192.0.2.7"), AgentNamespace: "x", URL: "http://192.0.2.7:9443/placement"},
		"URL with a query":    {Config: cfg, Address: mustAddr("192.0.2.7"), AgentNamespace: "x", URL: "https://agent.example/placement?x=1"},
		"short serving CA":    {Config: cfg, Address: mustAddr("192.0.2.7"), AgentNamespace: "x", CALifetime: time.Hour},
	} {
		if _, err := NewWebhook(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	w, err := NewWebhook(WebhookConfig{Config: cfg, Address: mustAddr("192.0.2.7"), AgentNamespace: "x", URL: "https://agent.example:8443/placement"})
	if err != nil {
		t.Fatal(err)
	}
	if w.url != "https://agent.example:8443/placement" || strings.Join(w.hosts, ",") != "192.0.2.7,agent.example" {
		t.Errorf("url %s, certificate names %v", w.url, w.hosts)
	}
	w, _ = NewWebhook(WebhookConfig{Config: cfg, Address: mustAddr("fd00::7"), AgentNamespace: "x"})
	if w.url != "https://[fd00::7]:9443/placement" {
		t.Errorf("url %s", w.url)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// Whatever a CA Secret holds (edited by hand), certs.DecodeCAs returns CAs
// whose keys match their certificates, or an error; it never panics.
func FuzzDecodeCAs(f *testing.F) {
	a, _ := certs.NewCA("test", time.Now(), time.Hour)
	data, _ := certs.CASet{a}.Encode()
	f.Add(data[certs.CACertKey], data[certs.CAKeyKey])
	f.Add([]byte("hello"), data[certs.CAKeyKey])
	f.Add(data[certs.CAKeyKey], data[certs.CACertKey])
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, pems, keys []byte) {
		cas, err := certs.DecodeCAs(map[string][]byte{certs.CACertKey: pems, certs.CAKeyKey: keys})
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

// The kubelet API's new CA signs as late as it can: until then the old
// one does, and its last serving certificates still run their full 7
// days, so an operator has months to copy the new bundle into
// --kubelet-certificate-authority.
func TestKubeletCASchedule(t *testing.T) {
	l := kubeletapi.Lifetimes(kubeletapi.Config{})
	if err := l.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cas, _, err := certs.CASet(nil).Rotated("test", start, l.CA)
	if err != nil {
		t.Fatal(err)
	}
	old := cas[0]
	rotate := cas.RotateAt(l.CA)
	cas, _, err = cas.Rotated("test", rotate.Add(time.Second), l.CA)
	if err != nil || len(cas) != 2 {
		t.Fatalf("at the rotation: %d CAs, %v", len(cas), err)
	}
	fresh := cas[1]
	published := map[string]time.Time{old.ID(): old.Made(), fresh.ID(): fresh.Made()}
	switchAt := fresh.Made().Add(l.Publish)
	if s := cas.Signer(published, switchAt.Add(-time.Second), l.Publish); s != old {
		t.Errorf("the new CA signs %s before the old one can no longer cover a serving certificate", time.Second)
	}
	if s := cas.Signer(published, switchAt, l.Publish); s != fresh {
		t.Errorf("the new CA does not sign once the old one cannot cover a serving certificate")
	}
	if left := old.Cert.NotAfter.Sub(switchAt); left < l.Serving-time.Minute {
		t.Errorf("the old CA's last serving certificate runs %s, less than %s", left, l.Serving)
	}
	if d := switchAt.Sub(fresh.Made()); d < 100*24*time.Hour {
		t.Errorf("the new CA signs %s after it is in the Secret; want months", d)
	}
}
