package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/internal/version"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The metrics port as a stranger on the pod network, or a process or
// pod in the node's own network namespace, sees it: the agent listens on
// the loopback and its node's address only; on both /healthz and /readyz
// answer anyone (the kubelet's probes carry no token), while /metrics,
// /trace, /build and the dashboard answer only a bearer token the API
// server knows and allows the path: deploy/rbac.yaml's
// flotilla-metrics-reader gets /metrics and nothing more, its
// flotilla-viewer everything. Each refusal is asked, with the refused
// party's own token, right after the same path answered an allowed one.
func TestMetricsPortAccess(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("metrics", harness.ControlPlaneOptions{})
	node, err := defaultAddress()
	if err != nil {
		t.Fatalf("no address but the loopback to serve on: %v", err)
	}
	applyClusterRoles(t, cp, "flotilla-metrics-reader", "flotilla-viewer")
	prometheus := boundAccount(t, cp, "prometheus", "flotilla-metrics-reader")
	operator := boundAccount(t, cp, "operator", "flotilla-viewer")
	stranger := boundAccount(t, cp, "stranger", "")

	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.Logger = cp.Kubeconfig, t.TempDir(), quietLog()
	cfg.MetricsAddr, cfg.NodeAddress = ":0", node
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.start = func(ctx context.Context, comps *components) error { return nil }
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })

	addrs := a.MetricsAddrs()
	if len(addrs) != 2 || !strings.HasPrefix(addrs[0], "127.0.0.1:") || !strings.HasPrefix(addrs[1], node.String()+":") {
		t.Fatalf("listening on %v, want the loopback and %s only", addrs, node)
	}
	outside := "http://" + addrs[1]
	get := func(path, token string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, outside+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		// The client asked for gzip (Go's transport does, unless told
		// otherwise); the page comes plain: a gzip writer is about 1 MiB
		// of the agent's memory.
		if path == "/metrics" && resp.StatusCode == http.StatusOK && resp.Uncompressed {
			t.Errorf("GET %s: served gzip-compressed, want it plain", path)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		t.Logf("GET %s%s with %s: %d %q", outside, path, map[string]string{"": "no token", prometheus: "prometheus's token", operator: "the operator's token", stranger: "a stranger's token", "not-a-token": "a token nobody issued"}[token], resp.StatusCode, bytes.TrimSpace(body))
		return resp.StatusCode
	}
	waitUntil(t, "health answered on "+outside, func() error {
		_, err := http.Get(outside + "/healthz")
		return err
	})

	// answered: a health answer, 200 or 503, not a refusal.
	const answered = -1
	for _, tc := range []struct {
		path, allowed, refused string
		want                   int
	}{
		{"/healthz", "", "", http.StatusOK},
		{"/readyz", "", "", answered}, // ready or not, answered
		{"/metrics", prometheus, "", http.StatusUnauthorized},
		{"/metrics", prometheus, "not-a-token", http.StatusUnauthorized},
		{"/metrics", prometheus, stranger, http.StatusForbidden},
		{"/trace", operator, prometheus, http.StatusForbidden},
		{"/build", operator, prometheus, http.StatusForbidden},
		{"/", operator, prometheus, http.StatusForbidden},
		{"/graph.json", operator, stranger, http.StatusForbidden},
	} {
		if tc.allowed == "" {
			got := get(tc.path, "")
			if tc.want == answered && (got == http.StatusOK || got == http.StatusServiceUnavailable) {
				continue
			}
			if got != tc.want {
				t.Errorf("GET %s without a token: %d, want %d", tc.path, got, tc.want)
			}
			continue
		}
		// Served: the dashboard answers 503 (with its page) while the
		// agent starts.
		if got := get(tc.path, tc.allowed); got == http.StatusUnauthorized || got == http.StatusForbidden || got == http.StatusTooManyRequests {
			t.Errorf("GET %s with an allowed token: %d, want it served", tc.path, got)
			continue
		}
		if got := get(tc.path, tc.refused); got != tc.want {
			t.Errorf("GET %s refused: %d, want %d", tc.path, got, tc.want)
		}
	}
	// The loopback is every host-network process's and pod's of the
	// node (the agent runs in the host network): health only, as
	// anywhere else. Refused after the operator's token was served the
	// same path there.
	for _, tc := range []struct {
		path  string
		token string
		want  int
	}{
		{"/healthz", "", http.StatusOK},
		{"/metrics", operator, http.StatusOK},
		{"/metrics", "", http.StatusUnauthorized},
		{"/trace", operator, http.StatusOK},
		{"/trace", "", http.StatusUnauthorized},
		{"/trace", stranger, http.StatusForbidden},
		{"/", "", http.StatusUnauthorized},
		{"/build", "", http.StatusUnauthorized},
	} {
		code, body, err := getMetricsPort(a, tc.path, tc.token)
		t.Logf("GET %s on the loopback with %s: %d %.100q", tc.path, map[string]string{"": "no token", operator: "the operator's token", stranger: "a stranger's token"}[tc.token], code, body)
		if err != nil || code != tc.want {
			t.Errorf("GET %s on the loopback: %d, %v; want %d", tc.path, code, err, tc.want)
		}
	}
	// /build is the build `flotilla version` prints for the client.
	code, body, err := getMetricsPort(a, "/build", operator)
	var build version.Info
	if err == nil && code == http.StatusOK {
		err = json.Unmarshal([]byte(body), &build)
	}
	if err != nil || code != http.StatusOK || build != Build() || build.Protocol.Current != peering.ProtocolVersion || build.Protocol.Max != peering.ProtocolVersionMax {
		t.Errorf("GET /build on the loopback: %d %q (%v); want 200 and %+v", code, body, err, Build())
	}
}

// applyClusterRoles creates the ClusterRoles named, as deploy/rbac.yaml
// has them.
func applyClusterRoles(t *testing.T, cp *harness.ControlPlane, names ...string) {
	t.Helper()
	raw, err := os.ReadFile("../deploy/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil || role.Kind != "ClusterRole" {
			continue
		}
		for _, n := range names {
			if role.Name == n {
				if _, err := cp.Client.RbacV1().ClusterRoles().Create(t.Context(), &role, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				found[n] = true
			}
		}
	}
	for _, n := range names {
		if !found[n] {
			t.Fatalf("deploy/rbac.yaml has no ClusterRole %s", n)
		}
	}
}

// boundAccount makes ServiceAccount default/name, bound to ClusterRole
// role unless empty, and returns a token of it.
func boundAccount(t *testing.T, cp *harness.ControlPlane, name, role string) string {
	t.Helper()
	ctx := t.Context()
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if role != "" {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "default"}}}
		if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expiry := int64(600)
	tr, err := cp.Client.CoreV1().ServiceAccounts("default").CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
