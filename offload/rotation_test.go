package offload

import (
	"fmt"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/test/harness"
)

// rotationSeen follows a CA rotation from outside, observation after
// observation: the CAs published (by subject key ID) and the CA that
// signed the certificate served.
type rotationSeen struct {
	first    []string
	sawBoth  bool
	issuers  []string
	deadline time.Time
}

func newRotationSeen(t *testing.T, first []string) *rotationSeen {
	t.Helper()
	if len(first) != 1 {
		t.Fatalf("CAs published before any rotation: %v, want 1", first)
	}
	return &rotationSeen{first: first, deadline: time.Now().Add(120 * time.Second)}
}

// observe notes what is published and who signed what is served; true
// once the first CA is gone, having been published beside its successor
// and both having signed.
func (r *rotationSeen) observe(t *testing.T, published []string, issuer string) bool {
	t.Helper()
	if len(published) == 2 {
		r.sawBoth = true
	}
	if len(r.issuers) == 0 || r.issuers[len(r.issuers)-1] != issuer {
		r.issuers = append(r.issuers, issuer)
	}
	if len(published) == 1 && published[0] != r.first[0] && r.sawBoth && len(r.issuers) >= 2 {
		if r.issuers[0] != r.first[0] {
			t.Errorf("the first serving certificate was signed by %s, not the first CA %s", r.issuers[0], r.first[0])
		}
		return true
	}
	if time.Now().After(r.deadline) {
		t.Fatalf("no full rotation seen: published %v (first %v), both seen %v, issuers %v", published, r.first, r.sawBoth, r.issuers)
	}
	return false
}

func (r *rotationSeen) String() string {
	return fmt.Sprintf("serving certificate issuers %v; first CA %v", r.issuers, r.first)
}

// grantNodesProxy lets user use verbs on nodes/proxy of every node of
// cp (the kubelet API), through a ClusterRole and a binding of name.
func grantNodesProxy(t *testing.T, cp *harness.ControlPlane, name, user string, verbs ...string) *rbacv1.ClusterRoleBinding {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: verbs}},
	}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return binding
}
