package kubeletapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
)

// kubeletUser is who a client certificate says the caller is, as the API
// server's own x509 authenticator reads it: the common name is the user,
// the organizations its groups.
type kubeletUser struct {
	name   string
	groups []string
}

// authenticate returns who r's client certificate names, once it chains
// to the cluster's client CA for client authentication.
func authenticate(ca *certs.ClientCA, r *http.Request) (kubeletUser, error) {
	leaf, err := ca.Verify(r.TLS)
	if err != nil {
		return kubeletUser{}, err
	}
	if leaf.Subject.CommonName == "" {
		return kubeletUser{}, errors.New("client certificate without a common name (the user)")
	}
	return kubeletUser{name: leaf.Subject.CommonName, groups: leaf.Subject.Organization}, nil
}

// The kubelet API's SubjectAccessReviews are cached (apiauth.Cache), as
// a kubelet caches its webhook authorizer's answers. The TTLs are short,
// so that a permission revoked stops working soon; a refusal is kept
// shorter still, so that one just granted works soon.
const (
	DefaultAuthorizedTTL   = 10 * time.Second
	DefaultUnauthorizedTTL = 5 * time.Second
	// authCacheSize bounds the answers: a caller, a verb and a node
	// each. Few callers use a kubelet API (the API server's kubelet
	// client, mostly), so this is room to spare, and a bound against one
	// that cycles names.
	authCacheSize = 1024
)

// proxyQuestion is what a review asks: the same question, the same
// answer.
type proxyQuestion struct {
	user, groups, verb, node string
}

// questionOf is u's question about node with the verb of method; the
// order of u's groups does not change it.
func questionOf(u kubeletUser, method, node string) proxyQuestion {
	groups := slices.Clone(u.groups)
	slices.Sort(groups)
	// NUL cannot be in a user's or a group's name from a certificate.
	return proxyQuestion{user: u.name, groups: strings.Join(groups, "\x00"), verb: verbOf(method), node: node}
}

// proxyAnswer is what the API server said.
type proxyAnswer struct {
	allowed bool
	reason  string
}

// authorize is authorizeProxy, answered from the cache while fresh.
func (k *Server) authorize(ctx context.Context, u kubeletUser, method, node string) (bool, string, error) {
	a, err := k.authz.Get(ctx, questionOf(u, method, node), func(ctx context.Context) (proxyAnswer, bool, error) {
		allowed, reason, err := authorizeProxy(ctx, k.cfg.Client, u, method, node)
		return proxyAnswer{allowed, reason}, allowed, err
	})
	return a.allowed, a.reason, err
}

// authorizeProxy asks the local API server, as a kubelet does, whether u
// may use the kubelet API of node: nodes/proxy, with the verb of the HTTP
// method. An empty node asks for every node.
func authorizeProxy(ctx context.Context, client kubeclient.Interface, u kubeletUser, method, node string) (bool, string, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.name, Groups: u.groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verbOf(method), Version: "v1", Resource: "nodes", Subresource: "proxy", Name: node,
		},
	}}
	got, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("SubjectAccessReview: %w", err)
	}
	return got.Status.Allowed, got.Status.Reason, nil
}

// verbOf maps an HTTP method to the verb a kubelet authorizes it as.
func verbOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return ""
}
