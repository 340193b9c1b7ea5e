package apiauth_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/apiauth"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A guarded endpoint on a real API server's reviews: the reader's own
// token gets /metrics (the positive witness, each refusal below asked
// right after it); no token, a token the API server does not know, a
// stranger's token, and the reader's on a path it was not granted are
// refused with 401 or 403; a flood past the rate is refused 429 before a
// review; and the loopback passes only when trusted.
func TestGuard(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	reader, stranger := account(t, cp, "reader", true), account(t, cp, "stranger", false)

	served := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served "+r.URL.Path) })
	serve := func(cfg apiauth.Config) *httptest.Server {
		cfg.Client = cp.Client
		g, err := apiauth.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewServer(g.Wrap(served))
		t.Cleanup(s.Close)
		return s
	}
	get := func(s *httptest.Server, path, token string) int {
		t.Helper()
		return getFrom(t, http.DefaultClient, s, path, token, who(token, reader, stranger))
	}

	guarded := serve(apiauth.Config{})
	for _, tc := range []struct {
		name, path, token string
		want              int
	}{
		{"no token", "/metrics", "", http.StatusUnauthorized},
		{"a token nobody issued", "/metrics", "not-a-token", http.StatusUnauthorized},
		{"a stranger's token", "/metrics", stranger, http.StatusForbidden},
		{"the reader's token on a path not granted", "/trace", reader, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := get(guarded, "/metrics", reader); got != http.StatusOK {
				t.Fatalf("the reader's own request: %d, want 200", got)
			}
			if got := get(guarded, tc.path, tc.token); got != tc.want {
				t.Errorf("%d, want %d", got, tc.want)
			}
		})
	}

	t.Run("past the rate", func(t *testing.T) {
		// Two requests in the bucket, none added for a long while.
		limited := serve(apiauth.Config{Rate: 0.0001, Burst: 2})
		if got := get(limited, "/metrics", reader); got != http.StatusOK {
			t.Fatalf("the first request: %d, want 200", got)
		}
		get(limited, "/metrics", reader)
		if got := get(limited, "/metrics", reader); got != http.StatusTooManyRequests {
			t.Errorf("the third request: %d, want 429", got)
		}
		// Another source has a bucket of its own.
		other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
		if got := getFrom(t, other, limited, "/metrics", reader, "the reader's token from 127.0.0.2"); got != http.StatusOK {
			t.Errorf("another source meanwhile: %d, want 200", got)
		}
	})

	t.Run("the loopback only when told to trust it", func(t *testing.T) {
		trusting := serve(apiauth.Config{TrustLoopback: true})
		if got := get(trusting, "/trace", ""); got != http.StatusOK {
			t.Errorf("trusted loopback without a token: %d, want 200", got)
		}
		if got := get(guarded, "/trace", ""); got != http.StatusUnauthorized {
			t.Errorf("untrusted loopback without a token: %d, want 401", got)
		}
	})
}

// Health stays on the loopback and the pod's address unless an address
// is given.
func TestAddresses(t *testing.T) {
	pod := netip.MustParseAddr("192.0.2.10")
	for _, tc := range []struct {
		addr string
		pod  netip.Addr
		want []string
	}{
		{":9470", pod, []string{"127.0.0.1:9470", "192.0.2.10:9470"}},
		{":9470", netip.Addr{}, []string{"127.0.0.1:9470"}},
		{"0.0.0.0:9470", pod, []string{"0.0.0.0:9470"}},
		{"127.0.0.1:0", pod, []string{"127.0.0.1:0"}},
	} {
		got, err := apiauth.Addresses(tc.addr, tc.pod)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Addresses(%q, %v) = %v, %v; want %v", tc.addr, tc.pod, got, err, tc.want)
		}
	}
	if _, err := apiauth.Addresses("9470", pod); err == nil {
		t.Error("an address without a port accepted")
	}
}

func getFrom(t *testing.T, client *http.Client, s *httptest.Server, path, token, as string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	t.Logf("GET %s with %s: %d %q", path, as, resp.StatusCode, body)
	return resp.StatusCode
}

func who(token, reader, stranger string) string {
	switch token {
	case "":
		return "no token"
	case reader:
		return "the reader's token"
	case stranger:
		return "the stranger's token"
	}
	return "an unknown token"
}

// account makes a ServiceAccount in default, bound (when reads) to a
// ClusterRole that may get /metrics and nothing else, and returns a
// token of it.
func account(t *testing.T, cp *harness.ControlPlane, name string, reads bool) string {
	t.Helper()
	ctx := t.Context()
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if reads {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
		if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "default"}}}
		if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
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
