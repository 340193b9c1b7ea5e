package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/harness"
)

// offload binds reflection's ClusterRole in the namespace with the
// caller's rights, and unoffload removes that binding; one of the same
// name that is not ours is never touched, and a caller who may not
// grant what the binding grants is refused, with its own token, before
// anything is offloaded.

// everyPeer selects every Peer: an offload must name its providers.
const everyPeer = "--selector=app.kubernetes.io/managed-by=flotilla"

func TestOffloadBindsReflection(t *testing.T) {
	e := newPeerEnv(t)
	ctx := t.Context()
	if err := harness.ApplyCRDs(ctx, e.cp.Config, deploy.CRDs, "crds/flotilla.io_namespaceoffloads.yaml"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), "--kubeconfig", e.cp.Kubeconfig,
		"apply", "--server-side", "-f", filepath.Join("..", "..", "deploy", "reflection.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply deploy/reflection.yaml: %v\n%s", err, out)
	}
	for _, ns := range []string{"shop", "mine", "ro"} {
		if _, err := e.cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rbac := e.cp.Client.RbacV1()
	kc := "--kubeconfig=" + e.cp.Kubeconfig
	namespaceLabel := func(t *testing.T, ns string) string {
		t.Helper()
		n, err := e.cp.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Labels[offload.LabelOffloaded]
	}
	offloaded := func(t *testing.T, ns string) bool {
		t.Helper()
		var o v1alpha1.NamespaceOffload
		err := e.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: offloadName}, &o)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}

	t.Run("offload makes it, labelled as ours", func(t *testing.T) {
		code, out, errOut := flotilla("offload", "namespace", "shop", kc, "--wait=0", everyPeer)
		if code != 0 || !strings.Contains(out, "RoleBinding flotilla-reflection created") {
			t.Fatalf("offload: exit %d\n%s%s", code, out, errOut)
		}
		b, err := rbac.RoleBindings("shop").Get(ctx, offload.ReflectionBinding, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "flotilla-system", Name: "flotilla-agent"}}
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != offload.ReflectionClusterRole || !slices.Equal(b.Subjects, want) ||
			b.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
			t.Errorf("RoleBinding shop/flotilla-reflection: roleRef %+v, subjects %+v, labels %v", b.RoleRef, b.Subjects, b.Labels)
		}
		if code, out, errOut := flotilla("offload", "namespace", "shop", kc, "--wait=0", everyPeer); code != 0 || !strings.Contains(out, "RoleBinding flotilla-reflection kept") {
			t.Errorf("offload again: exit %d\n%s%s", code, out, errOut)
		}
		// The label that sends the namespace's pods to the placement
		// webhook, set with the caller's rights: the agent may not.
		if v := namespaceLabel(t, "shop"); v != "true" {
			t.Errorf("namespace shop after offload: %s=%q, want true", offload.LabelOffloaded, v)
		}
	})

	t.Run("unoffload removes it", func(t *testing.T) {
		code, out, errOut := flotilla("unoffload", "namespace", "shop", kc, "--wait=0")
		if code != 0 || !strings.Contains(out, "RoleBinding flotilla-reflection deleted") {
			t.Fatalf("unoffload: exit %d\n%s%s", code, out, errOut)
		}
		if _, err := rbac.RoleBindings("shop").Get(ctx, offload.ReflectionBinding, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("RoleBinding shop/flotilla-reflection after unoffload: %v, want not found", err)
		}
		if !strings.Contains(out, "label "+offload.LabelOffloaded+" removed") || namespaceLabel(t, "shop") != "" {
			t.Errorf("namespace shop after unoffload: %s=%q, want it removed\n%s", offload.LabelOffloaded, namespaceLabel(t, "shop"), out)
		}
	})

	t.Run("one of that name made by someone else is left alone", func(t *testing.T) {
		theirs, err := rbac.RoleBindings("mine").Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: offload.ReflectionBinding},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "someone"}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		code, out, errOut := flotilla("offload", "namespace", "mine", kc, "--wait=0", everyPeer)
		if code == 0 || !strings.Contains(errOut, "not this command's, and left alone") {
			t.Errorf("offload over a foreign binding: exit %d, want a refusal\n%s%s", code, out, errOut)
		}
		if offloaded(t, "mine") {
			t.Errorf("namespace mine offloaded although its binding could not be made")
		}
		if code, out, errOut := flotilla("unoffload", "namespace", "mine", kc, "--wait=0"); code != 0 || strings.Contains(out, "deleted") {
			t.Errorf("unoffload: exit %d\n%s%s", code, out, errOut)
		}
		got, err := rbac.RoleBindings("mine").Get(ctx, offload.ReflectionBinding, metav1.GetOptions{})
		if err != nil || got.UID != theirs.UID || got.RoleRef.Name != "view" {
			t.Errorf("the foreign RoleBinding after offload and unoffload: %+v, %v", got, err)
		}
	})

	t.Run("a caller who may not grant it is refused with its own token", func(t *testing.T) {
		// May offload ro and write RoleBindings there, but not read its
		// Secrets: what the binding would give the agent.
		if _, err := e.cp.Client.CoreV1().ServiceAccounts("ro").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "editor"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := rbac.Roles("ro").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "offloader"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"flotilla.io"}, Resources: []string{"namespaceoffloads"}, Verbs: []string{"get", "list", "watch", "create", "update"}},
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"rolebindings"}, Verbs: []string{"get", "create"}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := rbac.RoleBindings("ro").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "offloader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "offloader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "ro", Name: "editor"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		editor := tokenKubeconfig(t, e.cp, "ro", "editor")
		// The witness that its rights are in force: it binds a role it
		// holds.
		eventually.Within(t, time.Minute, "the editor binds its own role", func() error {
			c, err := clusterClient(editor)
			if err != nil {
				return err
			}
			return c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "ro", Name: "witness"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "offloader"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "ro", Name: "editor"}}})
		})
		code, out, errOut := flotilla("offload", "namespace", "ro", "--kubeconfig="+editor, "--wait=0", everyPeer)
		if code == 0 || !strings.Contains(errOut, "create RoleBinding ro/flotilla-reflection") || !strings.Contains(errOut, "forbidden") ||
			!strings.Contains(errOut, "nothing was offloaded") {
			t.Errorf("offload by the editor: exit %d, want a refusal that says why\n%s%s", code, out, errOut)
		}
		t.Logf("refused: %s", strings.TrimSpace(errOut))
		if offloaded(t, "ro") || namespaceLabel(t, "ro") != "" {
			t.Errorf("namespace ro offloaded or labelled although its binding was refused")
		}
		if _, err := rbac.RoleBindings("ro").Get(ctx, offload.ReflectionBinding, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("RoleBinding ro/flotilla-reflection: %v, want not found", err)
		}
	})
}

// tokenKubeconfig writes a kubeconfig holding a token of ServiceAccount
// ns/name.
func tokenKubeconfig(t *testing.T, cp *harness.ControlPlane, ns, name string) string {
	t.Helper()
	expiry := int64(3600)
	tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: name}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%s.kubeconfig", ns, name))
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
