package agent

import (
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/offload/mcsdns"
)

// The clusterset DNS is on by default, on its port; a port out of range is
// refused at New, naming the flag.
func TestClustersetDNSPortFlag(t *testing.T) {
	if got := DefaultConfig().ClustersetDNSPort; got != mcsdns.DefaultPort {
		t.Errorf("default --clusterset-dns-port %d, want %d", got, mcsdns.DefaultPort)
	}
	for _, port := range []int{-1, 65536} {
		cfg := DefaultConfig()
		cfg.StateDir, cfg.Logger, cfg.ClustersetDNSPort = t.TempDir(), quietLog(), port
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "--clusterset-dns-port") {
			t.Errorf("--clusterset-dns-port %d: %v, want an error naming the flag", port, err)
		}
	}
}

// --coredns-forward names CoreDNS's ConfigMap as namespace/name; anything
// else, or the flag with the agent's DNS off, is refused at New, naming
// the flag.
func TestCoreDNSForwardFlag(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		dnsPort int
		want    string // "": not refused for it (New may still fail later, for want of a cluster)
	}{
		{"", mcsdns.DefaultPort, ""},
		{"kube-system/coredns", mcsdns.DefaultPort, ""},
		{"coredns", mcsdns.DefaultPort, "--coredns-forward"},
		{"kube-system/", mcsdns.DefaultPort, "--coredns-forward"},
		{"/coredns", mcsdns.DefaultPort, "--coredns-forward"},
		{"a/b/c", mcsdns.DefaultPort, "--coredns-forward"},
		{"kube-system/coredns", 0, "--clusterset-dns-port=0"},
	} {
		cfg := DefaultConfig()
		cfg.StateDir, cfg.Logger, cfg.CoreDNSForward, cfg.ClustersetDNSPort = t.TempDir(), quietLog(), tc.flag, tc.dnsPort
		_, err := New(cfg)
		switch {
		case tc.want == "" && err != nil && strings.Contains(err.Error(), "coredns-forward"):
			t.Errorf("--coredns-forward=%q: %v, want accepted", tc.flag, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("--coredns-forward=%q with port %d: %v, want an error naming %s", tc.flag, tc.dnsPort, err, tc.want)
		}
	}
}
