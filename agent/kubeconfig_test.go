package agent

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The agent's clients never hold a request back on their side: with
// client-go's default (5 a second, bursts of 10) each namespace offloaded
// waited about a second on the provider's core API client.
func TestKubeConfigDoesNotThrottle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := KubeConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A hundred namespaces offloaded at once are about 500 requests.
	for api, c := range map[string]rest.Interface{"core": cs.CoreV1().RESTClient(), "rbac": cs.RbacV1().RESTClient()} {
		l := c.GetRateLimiter()
		if l == nil {
			continue
		}
		for i := range 500 {
			if !l.TryAccept() {
				t.Fatalf("the %s API client holds request %d back (client-side rate limit %v a second)", api, i+1, l.QPS())
			}
		}
	}
}
