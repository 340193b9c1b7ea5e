package offload

import (
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/offload/grant"
)

// A consumer's client to a provider allows well above client-go's
// default of 5 requests a second, which made 100 NamespaceRequests take
// 20 s on each provider (BenchmarkNamespaceOffloadScale).
func TestCredentialClientRate(t *testing.T) {
	cfg := restConfigOf(grant.Grant{Server: "https://198.18.0.1:6443"})
	if cfg.QPS < 50 || cfg.Burst < 100 {
		t.Errorf("a provider's client allows %v requests a second (burst %d); want at least 50 (burst 100)", cfg.QPS, cfg.Burst)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := cs.CoreV1().RESTClient().GetRateLimiter().QPS(); got < 50 {
		t.Errorf("the clientset's limiter allows %v a second, want at least 50", got)
	}
}
