package offload

import (
	"context"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// applyCRDs creates the embedded CRDs, as the agent does at start, and
// waits until each is established.
func applyCRDs(ctx context.Context, cfg *rest.Config) error {
	return harness.ApplyCRDs(ctx, cfg, deploy.CRDs, "crds/*.yaml")
}

func mustApplyCRDs(t testing.TB, cfg *rest.Config) {
	t.Helper()
	if err := applyCRDs(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

// mustApplyCRDsTo applies the CRDs to every control plane at once.
func mustApplyCRDsTo(tb testing.TB, cps ...*harness.ControlPlane) {
	tb.Helper()
	var wg sync.WaitGroup
	for _, cp := range cps {
		wg.Go(func() {
			if err := applyCRDs(context.Background(), cp.Config); err != nil {
				tb.Error(err)
			}
		})
	}
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
}

// runController runs a controller's Run until the stop it returns is
// called, once, or the test ends; an error from Run fails the test,
// named what.
func runController(t testing.TB, what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
