package harness_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A control plane on a LAN: a site on that LAN reaches its API server at
// the LAN URL over TLS verified with the control plane's CA; a site on
// another LAN does not, though the same API server answers it through
// loopback.
func TestAPIServerOnLAN(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	var run string
	t.Run("env", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		lan, other := env.NewLAN("lan"), env.NewLAN("other")
		cp := env.ControlPlane("cp1", harness.ControlPlaneOptions{LAN: lan})
		on := env.NewSite("on", harness.SiteOptions{LAN: lan})
		off := env.NewSite("off", harness.SiteOptions{LAN: other})
		url := cp.LANURL()
		if want := "https://" + cp.LANAddr.String() + ":6443"; url != want || !lan.Prefix.Contains(cp.LANAddr) {
			t.Fatalf("LANURL = %q (address %s), want %q on %s", url, cp.LANAddr, want, lan.Prefix)
		}

		version, err := on.APIServerVersion(url, cp.CA())
		if err != nil {
			t.Fatalf("from a site on the LAN: %v", err)
		}
		if !strings.HasPrefix(version, "v1.") {
			t.Fatalf("from a site on the LAN: /version says %q", version)
		}

		// The witness that the other site's attempt got as far as the
		// network: the API server answers it through loopback.
		cp.ExposeTo(off.Netns)
		if _, err := off.APIServerVersion(cp.Config.Host, cp.CA()); err != nil {
			t.Fatalf("from the site off the LAN, through loopback: %v", err)
		}
		_, err = off.APIServerVersion(url, cp.CA())
		if !errors.Is(err, syscall.ENETUNREACH) {
			t.Fatalf("from the site off the LAN: %v, want network unreachable", err)
		}
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

// The API server accepts tokens for the audience of grants besides its
// own, and refuses any other audience.
func TestAPIServerAudiences(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp1", harness.ControlPlaneOptions{})
	if harness.OffloadAudience != offload.DefaultAudience {
		t.Fatalf("the harness's API servers accept %q, grants use %q", harness.OffloadAudience, offload.DefaultAudience)
	}
	for _, tc := range []struct {
		audience string
		ok       bool
	}{
		{offload.DefaultAudience, true},
		{"https://kubernetes.default.svc", true}, // pods' own tokens
		{"something-else", false},
	} {
		t.Run(tc.audience, func(t *testing.T) {
			ctx := context.Background()
			tr, err := cp.Client.CoreV1().ServiceAccounts("default").CreateToken(ctx, "default", &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{Audiences: []string{tc.audience}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("TokenRequest: %v", err)
			}
			cfg := &rest.Config{Host: cp.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.CA()}}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			switch {
			case tc.ok && err != nil:
				t.Fatalf("SelfSubjectReview with the token: %v", err)
			case tc.ok && review.Status.UserInfo.Username != "system:serviceaccount:default:default":
				t.Fatalf("the token authenticates as %q", review.Status.UserInfo.Username)
			case !tc.ok && !apierrors.IsUnauthorized(err):
				t.Fatalf("SelfSubjectReview with the token: %v, want 401 Unauthorized", err)
			}
		})
	}
}
