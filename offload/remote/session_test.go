package remote_test

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A session with a provider outlives a renewed token and sends the token
// held at each request: the same session is refused once the credential
// held is a token without the tenant's rights, and answers again once it
// is the tenant's. A credential that reaches another tenant namespace
// opens a new session; none held, none.
func TestSessionFollowsTheCredentialHeld(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("provider", harness.ControlPlaneOptions{})
	ctx := t.Context()

	const tenant, other = "flotilla-tenant-session", "flotilla-tenant-other"
	for _, ns := range []string{tenant, other} {
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// consumer may list ConfigMaps in the tenant namespace; stranger
	// may nothing.
	for _, sa := range []string{"consumer", "stranger"} {
		if _, err := cp.Client.CoreV1().ServiceAccounts(tenant).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cp.Client.RbacV1().Roles(tenant).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings(tenant).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-configmaps"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "consumer", Namespace: tenant}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	const provider = "provider"
	creds := &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}}
	hold := func(account, ns string, serial uint64) {
		cfg := offloadtest.ServiceAccountConfig(t, cp, tenant, account)
		cfg.Timeout = 10 * time.Second
		creds.Set(provider, remote.ProviderCredential{Config: cfg, Grant: grant.Grant{
			Provider: provider, Serial: serial, Server: cfg.Host, Namespace: ns, ExpiresAt: time.Now().Add(time.Hour)}})
	}
	sessions := remote.NewSessions(creds)
	sessionOf := func() *remote.Session {
		t.Helper()
		s, err := sessions.Of(provider)
		if err != nil {
			t.Fatalf("session with %s: %v", provider, err)
		}
		return s
	}
	list := func(s *remote.Session) error {
		var cms corev1.ConfigMapList
		return s.Client().List(ctx, &cms, client.InNamespace(tenant))
	}

	hold("consumer", tenant, 1)
	first := sessionOf()
	if err := list(first); err != nil {
		t.Fatalf("the tenant's own token lists its ConfigMaps: %v", err)
	}

	hold("stranger", tenant, 2)
	if s := sessionOf(); s != first {
		t.Fatal("a new token to the same server, CA and tenant opened a new session")
	}
	if err := list(first); !apierrors.IsForbidden(err) {
		t.Fatalf("the session sent the token held before: with the stranger's it got %v, want Forbidden", err)
	}

	hold("consumer", tenant, 3)
	if err := list(first); err != nil {
		t.Fatalf("back to the tenant's token, the same session: %v", err)
	}

	hold("consumer", other, 4)
	moved := sessionOf()
	if moved == first {
		t.Fatal("a credential for another tenant namespace kept the session")
	}
	if moved.TenantNamespace() != other {
		t.Fatalf("new session's tenant namespace is %q, want %q", moved.TenantNamespace(), other)
	}

	creds.Drop(provider)
	if _, err := sessions.Of(provider); !errors.Is(err, remote.ErrNoCredential) {
		t.Fatalf("no credential held: Of said %v, want ErrNoCredential", err)
	}
	if err := list(moved); err == nil {
		t.Fatal("a session whose credential is gone still reached the provider")
	}
}
