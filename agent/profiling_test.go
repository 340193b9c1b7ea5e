package agent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

// With Profiling the metrics port serves the Go runtime's profiles, as
// `go tool pprof` reads them; without it (the default) it does not.
func TestProfilingOnMetricsPort(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("pprof", harness.ControlPlaneOptions{})
	applyClusterRoles(t, cp, "flotilla-viewer")
	operator := boundAccount(t, cp, "operator", "flotilla-viewer")
	for _, tc := range []struct {
		name      string
		profiling bool
		want      int
	}{
		{"off by default", DefaultConfig().Profiling, http.StatusNotFound},
		{"on", true, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr, cfg.Logger = cp.Kubeconfig, t.TempDir(), "127.0.0.1:0", quietLog()
			cfg.Profiling = tc.profiling
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// Only the metrics port matters here.
			a.start = func(ctx context.Context, _ *components) error { return nil }
			runCtx, stop := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- a.Run(runCtx) }()
			t.Cleanup(func() {
				stop()
				if err := <-ran; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			get := func(path string) (int, string, error) { return getMetricsPort(a, path, operator) }
			// The witness that the port serves before judging the profile.
			waitUntil(t, "the metrics", func() error {
				code, body, err := get("/metrics")
				if err == nil && (code != http.StatusOK || !strings.Contains(body, "go_memstats_heap_inuse_bytes")) {
					err = fmt.Errorf("%d %.200s", code, body)
				}
				return err
			})
			code, body, err := get("/debug/pprof/heap?debug=1")
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.want {
				t.Fatalf("GET /debug/pprof/heap: %d, want %d\n%.300s", code, tc.want, body)
			}
			if tc.want == http.StatusOK && !strings.Contains(body, "heap profile:") {
				t.Errorf("GET /debug/pprof/heap?debug=1 is no heap profile:\n%.300s", body)
			}
		})
	}
}
