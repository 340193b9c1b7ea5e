package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The refusals of flotilla join, each with the refused party's own
// credential where it is about rights, each after the join got past the
// step before, and none of them changes anything on the joining cluster.
func TestJoinRefusals(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	a, b := newJoinCluster(t, env, "alpha"), newJoinCluster(t, env, "beta")
	ctx := t.Context()
	ns := federation.AgentNamespace

	t.Run("a user who may not read B's token", func(t *testing.T) {
		if _, err := b.cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "joiner"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		grantRole(t, b.cp, ns, "joiner", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}})
		joiner := tokenKubeconfig(t, b.cp, ns, "joiner")
		witnessConfigMaps(t, joiner, ns)
		was := a.secrets(t)
		code, out, errOut := flotilla("join", "--kubeconfig", a.cp.Kubeconfig, "--remote-kubeconfig", joiner, "--wait", "30s")
		if code != 1 || !strings.Contains(errOut, "you cannot read c's join token") || !strings.Contains(errOut, "ask an admin of that cluster") {
			t.Errorf("join with a B account that may not read Secrets: exit %d\n%s%s; want a refusal that says what to ask for", code, out, errOut)
		}
		t.Logf("refused: %s", strings.TrimSpace(errOut))
		if now := a.secrets(t); !sameVersions(was, now) {
			t.Errorf("A's Secrets changed: %v, were %v", now, was)
		}
	})

	t.Run("A belongs to another federation", func(t *testing.T) {
		other, err := discovery.GenerateFederationKey()
		if err != nil {
			t.Fatal(err)
		}
		otherTok, _ := discovery.JoinToken{Key: other}.Encode()
		if _, err := a.cp.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: agentapi.FederationSecret, Namespace: ns},
			Data: map[string][]byte{agentapi.SecretToken: []byte(otherTok)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		admin, err := clusterClient(a.cp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(ctx, &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "c-gamma"}}); err != nil {
			t.Fatal(err)
		}
		was := a.secrets(t)
		code, out, errOut := flotilla("join", "--kubeconfig", a.cp.Kubeconfig, "--remote-kubeconfig", b.cp.Kubeconfig, "--wait", "30s")
		// The witness: it read B's token, the step before.
		if !strings.Contains(out, "token read: beta ("+b.id+")") {
			t.Fatalf("join: exit %d\n%s%s; want it to read B's token first", code, out, errOut)
		}
		for _, want := range []string{"alpha belongs to another federation", "its Secret flotilla-federation holds key " + discovery.Fingerprint(other),
			"its peers are c-gamma", "Nothing was changed", "--force"} {
			if code != 1 || !strings.Contains(errOut, want) {
				t.Errorf("join of a cluster in another federation: exit %d\n%s%s; want a refusal saying %q", code, out, errOut, want)
			}
		}
		t.Logf("refused: %s", strings.TrimSpace(errOut))
		if now := a.secrets(t); !sameVersions(was, now) {
			t.Errorf("A's Secrets changed: %v, were %v", now, was)
		}
	})

	t.Run("--force without an agent to restart puts A's Secret back exactly", func(t *testing.T) {
		secrets := a.cp.Client.CoreV1().Secrets(ns)
		was, err := secrets.Get(ctx, agentapi.FederationSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		code, out, errOut := flotilla("join", "--kubeconfig", a.cp.Kubeconfig, "--remote-kubeconfig", b.cp.Kubeconfig, "--wait", "30s", "--force")
		// The witness: it wrote the Secret before it found no agent.
		if !strings.Contains(out, "alpha configured: Secret flotilla-system/flotilla-federation holds the join token of beta ("+b.id+")") {
			t.Fatalf("join --force: exit %d\n%s%s; want it to configure A first", code, out, errOut)
		}
		if code != 1 || !strings.Contains(errOut, "no agent pod in flotilla-system") || !strings.Contains(errOut, "alpha is as it was") {
			t.Errorf("join --force with no agent: exit %d\n%s%s; want it to fail and undo", code, out, errOut)
		}
		now, err := secrets.Get(ctx, agentapi.FederationSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(now.Data, was.Data) || !reflect.DeepEqual(now.Labels, was.Labels) || !reflect.DeepEqual(now.Annotations, was.Annotations) {
			t.Errorf("A's Secret after the undone join: data %v labels %v annotations %v; was %v, %v, %v",
				now.Data, now.Labels, now.Annotations, was.Data, was.Labels, was.Annotations)
		}
		if got, want := managers(now), managers(was); got != want {
			t.Errorf("A's Secret's field managers after the undone join:\n%s\nwere\n%s", got, want)
		}
	})

	t.Run("the same cluster twice", func(t *testing.T) {
		was := a.secrets(t)
		code, out, errOut := flotilla("join", "--kubeconfig", a.cp.Kubeconfig, "--remote-kubeconfig", a.cp.Kubeconfig, "--wait", "30s")
		if code != 1 || !strings.Contains(errOut, "are the same cluster ("+a.id+")") {
			t.Errorf("join of a cluster to itself: exit %d\n%s%s", code, out, errOut)
		}
		if now := a.secrets(t); !sameVersions(was, now) {
			t.Errorf("A's Secrets changed: %v, were %v", now, was)
		}
	})
}

// managers describes an object's field managers and what each owns.
func managers(s *corev1.Secret) string {
	var b strings.Builder
	for _, m := range s.ManagedFields {
		fields := ""
		if m.FieldsV1 != nil {
			fields = string(m.FieldsV1.Raw)
		}
		fmt.Fprintf(&b, "%s %s %s\n", m.Manager, m.Operation, fields)
	}
	return b.String()
}

// What makes a cluster a member of another federation, which a join
// refuses to take it out of without --force.
func TestOtherFederation(t *testing.T) {
	joining, other := testJoinKey(1), testJoinKey(2)
	tokenOf := func(k []byte) []byte { s, _ := discovery.JoinToken{Key: k}.Encode(); return []byte(s) }
	ringOf := func(k ...[]byte) []byte { r, _ := discovery.EncodeKeyring(k); return r }
	secret := func(data map[string][]byte) *corev1.Secret { return &corev1.Secret{Data: data} }
	for _, c := range []struct {
		name string
		st   joinerState
		want string
	}{
		{"alone with its own key", joinerState{}, ""},
		{"given the key it joins", joinerState{secret: secret(map[string][]byte{agentapi.SecretToken: tokenOf(joining)})}, ""},
		{"given another key", joinerState{secret: secret(map[string][]byte{agentapi.SecretToken: tokenOf(other)})}, "holds key " + discovery.Fingerprint(other)},
		{"a keyring with another key", joinerState{secret: secret(map[string][]byte{agentapi.SecretKeyring: ringOf(joining, other)})}, "holds key " + discovery.Fingerprint(other)},
		{"a damaged Secret", joinerState{secret: secret(map[string][]byte{agentapi.SecretToken: []byte("flt1.garbage")})}, ""},
		{"peers", joinerState{peers: []v1alpha1.Peer{{ObjectMeta: metav1.ObjectMeta{Name: "c-x"}, Status: v1alpha1.PeerStatus{ClusterName: "x"}}}}, "its peers are x (c-x)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := otherFederation(c.st, joining)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("otherFederation: %q, want %q", got, c.want)
			}
		})
	}
}

func testJoinKey(b byte) []byte { return []byte(strings.Repeat(string(rune('a'+b)), 32)) }
