package harness

import (
	"net/http"
	"net/url"
	"testing"
)

func TestVerbAndResource(t *testing.T) {
	for _, tc := range []struct {
		method, path, contentType string
		verb, resource            string
	}{
		{"POST", "/api/v1/namespaces", "", "create", "namespaces"},
		{"GET", "/api/v1/namespaces/a", "", "get", "namespaces"},
		{"PUT", "/api/v1/namespaces/a/status", "", "update", "namespaces/status"},
		{"GET", "/api/v1/namespaces/a/pods", "", "list", "pods"},
		{"GET", "/api/v1/namespaces/a/pods?watch=true", "", "watch", "pods"},
		{"POST", "/api/v1/namespaces/a/serviceaccounts/b/token", "", "create", "serviceaccounts/token"},
		{"PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings/b", "application/apply-patch+yaml", "apply", "rolebindings"},
		{"PATCH", "/apis/flotilla.io/v1alpha1/namespaces/a/namespacerequests/b/status", "application/merge-patch+json", "patch", "namespacerequests/status"},
		{"POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", "", "create", "selfsubjectreviews"},
		{"DELETE", "/api/v1/namespaces/a/secrets/b", "", "delete", "secrets"},
		{"GET", "/apis/flotilla.io/v1alpha1/peers", "", "list", "peers"},
	} {
		u, err := url.Parse(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		req := &http.Request{Method: tc.method, URL: u, Header: http.Header{"Content-Type": {tc.contentType}}}
		if verb, resource := verbAndResource(req); verb != tc.verb || resource != tc.resource {
			t.Errorf("%s %s: %s %s, want %s %s", tc.method, tc.path, verb, resource, tc.verb, tc.resource)
		}
	}
}
