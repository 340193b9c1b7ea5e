package agent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

type ignoreSpecs struct{}

func (ignoreSpecs) SpecChanged(string, peering.Spec) {}
func (ignoreSpecs) SpecDeleted(string)               {}

// The metrics port serves the dashboard: while the agent starts it says
// so, and once the Peers are watched it shows them.
func TestDashboardOnMetricsPort(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("dash", harness.ControlPlaneOptions{})
	ctx := t.Context()
	if err := harness.ApplyCRDs(ctx, cp.Config, deploy.CRDs, "crds/*.yaml"); err != nil {
		t.Fatal(err)
	}
	w, err := client.New(cp.Config, client.Options{Scheme: peerapi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "2b2b2b2b-0000-4000-8000-000000000002"}}
	if err := w.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status = v1alpha1.PeerStatus{ClusterName: "beta", Phase: v1alpha1.PhaseConnected, Endpoint: "192.0.2.2:51820"}
	if err := w.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr, cfg.Logger = cp.Kubeconfig, t.TempDir(), "127.0.0.1:0", quietLog()
	cfg.ClusterName = "alpha"
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	feed := make(chan struct{})
	a.start = func(ctx context.Context, comps *components) error {
		objects, err := peerapi.New(a.restCfg, a.log)
		if err != nil {
			return err
		}
		comps.Go("Peer objects", func(ctx context.Context) error { return objects.Run(ctx, ignoreSpecs{}) })
		select {
		case <-feed:
		case <-ctx.Done():
			return ctx.Err()
		}
		<-objects.Synced()
		a.feedDashboard("1a1a1a1a-0000-4000-8000-000000000001", objects, nil)
		return nil
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// An operator's token: the loopback is trusted no more than any
	// other address.
	applyClusterRoles(t, cp, "flotilla-viewer")
	operator := boundAccount(t, cp, "operator", "flotilla-viewer")
	admin := boundAccount(t, cp, "admin", "cluster-admin")
	page := func() (int, string, error) { return getMetricsPort(a, "/", operator) }
	waitUntil(t, "the page while starting", func() error {
		code, body, err := page()
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "the agent is starting") || !strings.Contains(body, "Flotilla: alpha") {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	close(feed)
	waitUntil(t, "the page with beta", func() error {
		code, body, err := page()
		if err != nil {
			return err
		}
		if code != http.StatusOK || !strings.Contains(body, `<td>beta</td>`) || !strings.Contains(body, `class="phase-Connected"`) {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	// flotilla-viewer names the paths the port serves; an account that
	// may get any path is told what is not there.
	code, _, err := getMetricsPort(a, "/nothing-here", admin)
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusNotFound {
		t.Errorf("GET /nothing-here: %d, want 404", code)
	}
}
