package agent

import (
	"strings"
	"testing"
)

// --fence-dns-service names the cluster DNS's Service as namespace/name,
// kube-system/kube-dns by default; anything else is refused at New,
// naming the flag.
func TestFenceDNSServiceFlag(t *testing.T) {
	if got := DefaultConfig().FenceDNSService; got != "kube-system/kube-dns" {
		t.Errorf("default --fence-dns-service %q, want kube-system/kube-dns", got)
	}
	for _, tc := range []struct {
		flag    string
		refused bool
	}{
		{"kube-system/kube-dns", false},
		{"dns/coredns", false},
		{"", true},
		{"kube-dns", true},
		{"kube-system/", true},
		{"/kube-dns", true},
		{"a/b/c", true},
	} {
		cfg := DefaultConfig()
		cfg.StateDir, cfg.Logger, cfg.FenceDNSService = t.TempDir(), quietLog(), tc.flag
		_, err := New(cfg)
		named := err != nil && strings.Contains(err.Error(), "--fence-dns-service")
		if named != tc.refused {
			t.Errorf("--fence-dns-service=%q: %v, want refused %v (naming the flag)", tc.flag, err, tc.refused)
		}
	}
}
