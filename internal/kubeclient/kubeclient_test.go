package kubeclient

import (
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// Clientsets from one configuration share one connection to the API
// server; NewOwnConnection's has its own, which it keeps.
func TestNewOwnConnectionDoesNotShare(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("%s over %s, want HTTP/2", r.URL.Path, r.Proto)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"major":"1","minor":"34","gitVersion":"v1.34.4"}`))
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}),
	}}

	must := func(c *Clientset, err error) *Clientset {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	shared1, shared2, own := must(NewForConfig(cfg)), must(NewForConfig(cfg)), must(NewOwnConnection(cfg))
	for _, step := range []struct {
		name  string
		c     *Clientset
		conns int32
	}{
		{"the first clientset", shared1, 1},
		{"a second clientset of the same configuration", shared2, 1},
		{"NewOwnConnection's", own, 2},
		{"NewOwnConnection's again", own, 2},
		{"the first clientset again", shared1, 2},
	} {
		if _, err := step.c.Discovery().ServerVersion(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := conns.Load(); got != step.conns {
			t.Errorf("after a request of %s: %d connections, want %d", step.name, got, step.conns)
		}
	}
}
