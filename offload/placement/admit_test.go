package placement

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"
)

// What is not an AdmissionReview is answered 400 and counted, before
// anything is read from the cluster.
func TestPlacementWebhookRefusesBadReviews(t *testing.T) {
	reg := prometheus.NewRegistry()
	w, err := NewWebhook(WebhookConfig{
		Config: &rest.Config{Host: "https://127.0.0.1:1"}, Address: mustAddr("127.0.0.1"), AgentNamespace: "flotilla-system",
		AnyClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: reg,
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

// What the webhook would buffer is bounded before it reads a review: a
// body announced too large, and one of unknown length (chunked), are
// refused unread, and a request finding every slot taken is refused once
// it waited its turn.
func TestPlacementWebhookBoundsRequests(t *testing.T) {
	const eight = 8 << 20
	for _, tc := range []struct {
		name     string
		size     int64 // announced; -1 for unknown (chunked)
		busy     bool
		code     int
		reason   string
		readMost int64
	}{
		{"announced too large", eight, false, http.StatusRequestEntityTooLarge, limitTooLarge, 0},
		{"length unknown", -1, false, http.StatusLengthRequired, limitUnknownLength, 0},
		{"length unknown, every slot taken", -1, true, http.StatusLengthRequired, limitUnknownLength, 0},
		{"every slot taken", 100, true, http.StatusTooManyRequests, limitBusy, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := NewWebhook(WebhookConfig{
				Config: &rest.Config{Host: "https://127.0.0.1:1"}, Address: mustAddr("127.0.0.1"), AgentNamespace: "flotilla-system",
				AnyClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: prometheus.NewRegistry(),
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.busy {
				for range maxConcurrentReviews {
					w.slots <- struct{}{}
				}
			}
			body := &sizedBody{left: eight}
			req := httptest.NewRequest(http.MethodPost, placementPath, body)
			req.ContentLength = tc.size
			rec := httptest.NewRecorder()
			w.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Errorf("%d, want %d", rec.Code, tc.code)
			}
			if got := testutil.ToFloat64(w.limited.WithLabelValues(tc.reason)); got != 1 {
				t.Errorf("%s counted %v times, want 1", tc.reason, got)
			}
			if body.read > tc.readMost {
				t.Errorf("%d bytes of the body read, at most %d wanted", body.read, tc.readMost)
			}
		})
	}
}

// By default a client certificate is required: a request without one
// is refused (401) before its body is read.
func TestPlacementWebhookRequiresAClientCertificateByDefault(t *testing.T) {
	w, err := NewWebhook(WebhookConfig{
		Config: &rest.Config{Host: "https://127.0.0.1:1"}, Address: mustAddr("127.0.0.1"), AgentNamespace: "flotilla-system",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	body := &sizedBody{left: 100}
	req := httptest.NewRequest(http.MethodPost, placementPath, body)
	rec := httptest.NewRecorder()
	w.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("%d, want 401", rec.Code)
	}
	if got := testutil.ToFloat64(w.limited.WithLabelValues(limitNoClientCert)); got != 1 {
		t.Errorf("%s counted %v times, want 1", limitNoClientCert, got)
	}
	if body.read > 0 {
		t.Errorf("%d bytes of the body read before the client was known", body.read)
	}
	if msg := rec.Body.String(); !strings.Contains(msg, "AdmissionConfiguration") || !strings.Contains(msg, "--webhook-client-ca=none") {
		t.Errorf("the refusal does not say what to configure: %q", msg)
	}
}

// A client certificate required, a webhook built without a usable CA,
// or told both to check certificates and to answer anyone, is refused
// before it starts.
func TestPlacementWebhookClientCAChecked(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	for name, c := range map[string]WebhookConfig{
		"no PEM in the CA bundle": {ClientCA: []byte("not a certificate")},
		"a CA, yet any client":    {ClientCA: []byte("-"), AnyClient: true},
		"names, yet any client":   {ClientNames: []string{"kube-apiserver"}, AnyClient: true},
	} {
		c.Config, c.Address, c.AgentNamespace = cfg, mustAddr("127.0.0.1"), "x"
		if _, err := NewWebhook(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// sizedBody is a body of left bytes that counts what was read.
type sizedBody struct{ left, read int64 }

func (b *sizedBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), b.left)
	b.left -= n
	b.read += n
	return int(n), nil
}
