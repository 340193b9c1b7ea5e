package main

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// joinCluster is a real API server with Flotilla's namespace and CRDs and
// the join token its agent would publish, written by the test.
type joinCluster struct {
	cp    *harness.ControlPlane
	token string
	key   []byte
	id    string
}

func newJoinCluster(t *testing.T, env *harness.Env, name string) *joinCluster {
	t.Helper()
	cp := env.ControlPlane(name, harness.ControlPlaneOptions{})
	if err := federation.EnsureAgentNamespace(cp); err != nil {
		t.Fatal(err)
	}
	if err := harness.ApplyCRDs(t.Context(), cp.Config, deploy.CRDs, "crds/flotilla.io_peers.yaml"); err != nil {
		t.Fatal(err)
	}
	key, err := discovery.GenerateFederationKey()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := discovery.JoinToken{Key: key, Seeds: []string{"198.18.0.1:7946"}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	c := &joinCluster{cp: cp, token: tok, key: key, id: id.ClusterID()}
	// As the agent publishes it.
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: agentapi.JoinSecret, Namespace: federation.AgentNamespace,
		Labels:      map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/managed-by": "flotilla"},
		Annotations: map[string]string{agentapi.AnnotationClusterID: c.id, agentapi.AnnotationClusterName: name}},
		Data: map[string][]byte{agentapi.SecretToken: []byte(tok)}}
	if _, err := cp.Client.CoreV1().Secrets(federation.AgentNamespace).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// secrets are the resource versions of the Secrets in the agent's
// namespace, by name: one moves with any change to its Secret.
func (c *joinCluster) secrets(t *testing.T) map[string]string {
	t.Helper()
	l, err := c.cp.Client.CoreV1().Secrets(federation.AgentNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range l.Items {
		out[s.Name] = s.ResourceVersion
	}
	return out
}

func sameVersions(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// flotilla token reads the published token through the API server with
// the caller's own rights, and says what to ask for when it may not.
func TestTokenThroughTheAPIServer(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	c := newJoinCluster(t, env, "alpha")
	ctx := t.Context()

	code, out, errOut := flotilla("token", "--kubeconfig", c.cp.Kubeconfig)
	if code != 0 || strings.TrimSpace(out) != c.token {
		t.Fatalf("token as an admin: exit %d, %q\n%s; want the published token", code, out, errOut)
	}

	// A reader of the namespace's ConfigMaps, not of its Secrets.
	ns := federation.AgentNamespace
	if _, err := c.cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "viewer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grantRole(t, c.cp, ns, "viewer", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}})
	viewer := tokenKubeconfig(t, c.cp, ns, "viewer")
	witnessConfigMaps(t, viewer, ns)
	code, out, errOut = flotilla("token", "--kubeconfig", viewer)
	if code != 1 || out != "" || !strings.Contains(errOut, "you cannot read c's join token") || !strings.Contains(errOut, "ask an admin") ||
		strings.Contains(errOut, c.token) {
		t.Errorf("token as a viewer without Secret read: exit %d\n%s%s; want a refusal that says what to ask for", code, out, errOut)
	}
	t.Logf("refused: %s", strings.TrimSpace(errOut))

	// What the other cluster wrote is checked before it is used: its
	// cluster ID names the Peer a join waits for.
	s, err := c.cp.Client.CoreV1().Secrets(ns).Get(ctx, agentapi.JoinSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations[agentapi.AnnotationClusterID] = "../peers"
	if _, err := c.cp.Client.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = flotilla("token", "--kubeconfig", c.cp.Kubeconfig)
	if code != 1 || out != "" || !strings.Contains(errOut, "annotation flotilla.io/cluster-id: cluster ID \"../peers\"") {
		t.Errorf("token with a bad cluster ID: exit %d\n%s%s; want it refused naming the annotation", code, out, errOut)
	}

	if err := c.cp.Client.CoreV1().Secrets(ns).Delete(ctx, agentapi.JoinSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = flotilla("token", "--kubeconfig", c.cp.Kubeconfig)
	if code != 1 || !strings.Contains(errOut, "no Secret flotilla-system/flotilla-join") || !strings.Contains(errOut, "agent running") {
		t.Errorf("token without a published one: exit %d\n%s; want it to say the agent has published none", code, errOut)
	}
}

// grantRole gives ServiceAccount ns/sa a Role of rules in ns.
func grantRole(t *testing.T, cp *harness.ControlPlane, ns, sa string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	rbac := cp.Client.RbacV1()
	if _, err := rbac.Roles(ns).Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// witnessConfigMaps waits until kubeconfig's rights are in force: it
// lists the ConfigMaps of ns.
func witnessConfigMaps(t *testing.T, kubeconfig, ns string) {
	t.Helper()
	eventually.Within(t, time.Minute, "the account lists ConfigMaps in "+ns, func() error {
		cfg, _, err := clusterRef{kubeconfig: kubeconfig}.restConfig()
		if err != nil {
			return err
		}
		core, err := corev1client.NewForConfig(cfg)
		if err != nil {
			return err
		}
		_, err = core.ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
		return err
	})
}
