package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The agent, started against a real control plane, reports healthy and
// ready, serves Prometheus metrics, and exits 0 on SIGTERM.
func TestAgentSmoke(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	bin := harness.Flotilla(t)
	harness.Require(t, harness.NeedsNetwork...)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	if err := federation.EnsureAgentNamespace(cp); err != nil {
		t.Fatal(err)
	}
	// The agent owns kernel state (a WireGuard link, routes, nftables):
	// it runs in a site, never in the test machine's own namespace.
	site := env.NewSite("a", harness.SiteOptions{LAN: env.NewLAN("lan")})
	cp.ExposeTo(site.Netns)
	agent := site.Start("agent", bin, "agent",
		"--kubeconfig", cp.Kubeconfig,
		"--state-dir", filepath.Join(env.Dir, "state"),
		"--metrics-addr", "127.0.0.1:9470",
		// The site is the test's alone: it reads the metrics there.
		"--metrics-trust-loopback",
		"--pod-cidr", "10.0.0.0/16",
		"--wireguard-interface", env.LinkName("s"),
		"--log-format", "json")

	base := "http://127.0.0.1:9470"
	client := siteClient(site)
	waitFor(t, agent, 60*time.Second, func() error { return expectBody(client, base+"/healthz", 200, "ok") })
	waitFor(t, agent, 60*time.Second, func() error { return expectBody(client, base+"/readyz", 200, "ok") })
	for _, check := range []string{"kubernetes", "ledger", "tunnel", "discovery", "peering", "placement webhook", "kubelet API"} {
		if err := expectBody(client, base+"/readyz?verbose", 200, "[+]"+check+" ok"); err != nil {
			t.Error(err)
		}
	}

	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("/metrics content type %q, want Prometheus text format", ct)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text format: %v", err)
	}
	for _, name := range []string{"flotilla_build_info", "flotilla_apiserver_up", "go_goroutines", "process_resident_memory_bytes",
		"flotilla_peers", "flotilla_discovery_members",
		"flotilla_remap_pool_addresses", "flotilla_remap_pool_used_addresses", "flotilla_remap_pool_largest_free_block_addresses"} {
		if _, ok := families[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if up := families["flotilla_apiserver_up"]; up != nil && up.Metric[0].GetGauge().GetValue() != 1 {
		t.Errorf("flotilla_apiserver_up = %v, want 1", up.Metric[0].GetGauge().GetValue())
	}

	// Kubernetes sends SIGTERM and waits a grace period; the agent must be
	// out well within it.
	if err := agent.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-agent.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("agent still running 5 s after SIGTERM\n%s", agent.Tail(20))
	}
	if _, err := agent.Exited(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v\n%s", err, agent.Tail(20))
	}
	if !strings.Contains(agent.Log(), `"msg":"agent stopped"`) {
		t.Errorf("no JSON log line for the stop:\n%s", agent.Tail(20))
	}
}

func expectBody(client *http.Client, url string, status int, want string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status || !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %d %q, want %d with %q", url, resp.StatusCode, body, status, want)
	}
	return nil
}
