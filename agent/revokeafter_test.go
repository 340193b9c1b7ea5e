package agent

import (
	"strings"
	"testing"
	"time"
)

// A consumer's grant outlives a partition: revoked after a day by
// default, far past the tunnel's grace; a setting shorter than that grace
// is refused at New, naming both flags.
func TestOffloadRevokeAfterFlag(t *testing.T) {
	def := DefaultConfig()
	if def.OffloadRevokeAfter != 24*time.Hour || def.OffloadRevokeAfter <= def.UnreachableGrace {
		t.Errorf("default --offload-revoke-after %s (--unreachable-grace %s), want 24h", def.OffloadRevokeAfter, def.UnreachableGrace)
	}
	cfg := DefaultConfig()
	cfg.StateDir, cfg.Logger, cfg.OffloadRevokeAfter = t.TempDir(), quietLog(), time.Minute
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "--offload-revoke-after") || !strings.Contains(err.Error(), "--unreachable-grace") {
		t.Errorf("--offload-revoke-after 1m with --unreachable-grace 5m: %v, want an error naming both", err)
	}
}
