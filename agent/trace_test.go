package agent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/observe/trace"
)

// TestTraceBeforeTheTunnel: /trace on the metrics port serves the node's
// routing state and says the tunnel has not started, rather than falling
// through to the dashboard or failing.
func TestTraceBeforeTheTunnel(t *testing.T) {
	// New reads a kubeconfig and connects to nothing; the handler asks
	// no API server.
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.Logger, cfg.NodeName = kc, t.TempDir(), quietLog(), "gw-1"
	// The report, not who may read it (TestMetricsPortAccess): the test
	// reads it on the loopback, without a token.
	cfg.MetricsTrustLoopback = true
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler())
	defer srv.Close()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/trace", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	rep, err := trace.ParseNodeReport(body)
	if resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("GET /trace: %s, %v\n%s", resp.Status, err, body)
	}
	if rep.Node != "gw-1" || rep.Kernel == nil || len(rep.Kernel.Routes) == 0 || rep.Tunnel != nil ||
		!slices.Contains(rep.Errors, "the tunnel has not started yet") {
		t.Errorf("GET /trace: %s", body)
	}
}
