package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/internal/eventually"

	"github.com/flotilla-io/flotilla/test/harness"
)

// waitUntil waits up to a minute for cond, failing t with what and its
// last error.
func waitUntil(t *testing.T, what string, cond func() error) {
	t.Helper()
	eventually.Within(t, time.Minute, what, cond)
}

// getMetricsPort GETs path on a's metrics port with token (none when
// empty): status and body.
func getMetricsPort(a *Agent, path, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+a.MetricsAddr()+path, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// A component that dies stops the agent: Run returns its error, naming it
// (`flotilla agent` then exits 1 and Kubernetes restarts the pod), after
// stopping every other component, newest first, and the health server.
func TestRunStopsWhenAComponentDies(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("run", harness.ControlPlaneOptions{})
	newAgent := func(t *testing.T) *Agent {
		cfg := DefaultConfig()
		cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr, cfg.Logger = cp.Kubeconfig, t.TempDir(), "127.0.0.1:0", quietLog()
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	t.Run("while running", func(t *testing.T) {
		a := newAgent(t)
		die := make(chan struct{})
		var stopped stopLog
		a.start = func(ctx context.Context, comps *components) error {
			comps.OnStop("ledger", func() error { stopped.add("ledger"); return nil })
			comps.Go("tunnel repair loop", func(ctx context.Context) error {
				<-ctx.Done()
				stopped.add("tunnel repair loop")
				return nil
			})
			comps.Go("Peer informer", func(ctx context.Context) error {
				select {
				case <-die:
					return errors.New("watch ended")
				case <-ctx.Done():
					return nil
				}
			})
			comps.Go("member events", func(ctx context.Context) error {
				<-ctx.Done()
				stopped.add("member events")
				return nil
			})
			return nil
		}
		ran := make(chan error, 1)
		go func() { ran <- a.Run(context.Background()) }()
		readyz := "http://" + a.MetricsAddr() + "/readyz"
		waitUntil(t, "the agent ready", func() error {
			resp, err := http.Get(readyz)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%d %s", resp.StatusCode, body)
			}
			return nil
		})

		close(die)
		err := <-ran
		if err == nil || !strings.Contains(err.Error(), "Peer informer: watch ended") {
			t.Fatalf("Run returned %v, want the Peer informer's error", err)
		}
		if got, want := stopped.get(), []string{"member events", "tunnel repair loop", "ledger"}; !slices.Equal(got, want) {
			t.Fatalf("stopped %v, want %v", got, want)
		}
		if resp, err := http.Get(readyz); err == nil {
			resp.Body.Close()
			t.Fatalf("/readyz still served after Run returned: %s", resp.Status)
		}
	})

	t.Run("while starting", func(t *testing.T) {
		a := newAgent(t)
		a.start = func(ctx context.Context, comps *components) error {
			comps.Go("peering engine", func(context.Context) error { return errors.New("restore: ledger unreadable") })
			<-ctx.Done() // as a start step waiting for the engine
			return fmt.Errorf("peering engine not ready: %w", ctx.Err())
		}
		err := a.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), "peering engine: restore: ledger unreadable") {
			t.Fatalf("Run returned %v, want the engine's own error", err)
		}
	})
}
