package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// The agent's clients have no client-side rate limit: at client-go's
// default of 5 requests a second, a provider mirrored one namespace a
// second (BenchmarkNamespaceOffloadScale, docs/offload.md).
func TestAgentClientsAreNotThrottledClientSide(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// No server is reached: New only builds the clients.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr, cfg.Logger = kubeconfig, filepath.Join(dir, "state"), "", quietLog()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a.restCfg.QPS >= 0 {
		t.Errorf("the agent's REST config has QPS %v: client-go's limiter throttles every client made from it; want < 0 (none)", a.restCfg.QPS)
	}
	if l := a.kube.CoreV1().RESTClient().GetRateLimiter(); l != nil {
		t.Errorf("the agent's clientset has a client-side rate limiter (%T)", l)
	}
}
