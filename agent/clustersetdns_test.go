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
