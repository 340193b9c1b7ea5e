package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/test/harness"
)

var sharedCRDs = []string{"serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io", "clusterproperties.about.k8s.io"}

// uninstall on a real control plane with deploy/ applied and a
// ServiceExport another MCS implementation made: refused with the
// refused party's own token, deleting nothing; then everything of ours
// goes, while the shared CRDs and the foreign ServiceExport stay and the
// output names what it kept; with --delete-shared-crds those go too.
func TestUninstallKeepsSharedCRDs(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("uninstall", harness.ControlPlaneOptions{})
	kubectl := filepath.Join(harness.KubeBinDir(), "kubectl")
	if out, err := exec.Command(kubectl, "--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "-k", "../../deploy").CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -k deploy/: %v\n%s", err, out)
	}
	if out, err := exec.Command(kubectl, "--kubeconfig", cp.Kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/peers.flotilla.io", "crd/"+sharedCRDs[0]).CombinedOutput(); err != nil {
		t.Fatalf("CRDs not Established: %v\n%s", err, out)
	}
	admin, err := client.New(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	export := &unstructured.Unstructured{}
	export.SetGroupVersionKind(schema.GroupVersionKind{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Kind: "ServiceExport"})
	export.SetNamespace("shop")
	export.SetName("web")
	export.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "another-mcs"})
	if err := admin.Create(ctx, export); err != nil {
		t.Fatalf("create a foreign ServiceExport: %v", err)
	}
	exists := func(obj client.Object) bool {
		t.Helper()
		err := admin.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			t.Fatalf("read %s: %v", obj.GetName(), err)
		}
		return err == nil
	}
	crd := func(name string) client.Object {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		u.SetName(name)
		return u
	}
	agentNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-system"}}
	dnsService := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "flotilla-system", Name: clustersetDNS}}

	t.Run("refused, with the refused party's own token", func(t *testing.T) {
		nobody := serviceAccountKubeconfig(t, cp, "default", "nobody")
		code, out, errOut := flotilla("uninstall", "--kubeconfig", nobody)
		// The witness that it tried: the API server's refusal of its first delete.
		if code == 0 || !strings.Contains(errOut, `services "flotilla-clusterset-dns" is forbidden: User "system:serviceaccount:default:nobody"`) {
			t.Fatalf("uninstall as nobody: exit %d\n%s%s", code, out, errOut)
		}
		if strings.Contains(out, "deleted") || !exists(dnsService) || !exists(agentNS) {
			t.Errorf("uninstall as nobody deleted something:\n%s", out)
		}
	})

	code, out, errOut := flotilla("uninstall", "--kubeconfig", cp.Kubeconfig)
	if code != 0 || !strings.Contains(out, "deleted Deployment flotilla-system/flotilla-agent") || !strings.Contains(out, "gone: ") {
		t.Fatalf("uninstall: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("uninstall:\n%s", out)
	for _, name := range sharedCRDs {
		if !strings.Contains(out, "kept    CustomResourceDefinition "+name+": ") {
			t.Errorf("uninstall does not say it kept %s:\n%s", name, out)
		}
		if !exists(crd(name)) {
			t.Errorf("uninstall deleted the shared CRD %s", name)
		}
	}
	if !exists(export) {
		t.Error("uninstall deleted the foreign ServiceExport shop/web")
	}
	for _, obj := range []client.Object{agentNS, dnsService, crd("peers.flotilla.io"), crd("namespaceoffloads.flotilla.io")} {
		if exists(obj) {
			t.Errorf("%s still there after uninstall", obj.GetName())
		}
	}

	code, out, errOut = flotilla("uninstall", "--kubeconfig", cp.Kubeconfig, "--delete-shared-crds")
	if code != 0 || strings.Contains(out, "kept") || !strings.Contains(out, "absent  Deployment flotilla-system/flotilla-agent") {
		t.Fatalf("uninstall --delete-shared-crds: exit %d\n%s%s", code, out, errOut)
	}
	for _, name := range sharedCRDs {
		if !strings.Contains(out, "deleted CustomResourceDefinition "+name) || exists(crd(name)) {
			t.Errorf("uninstall --delete-shared-crds left %s:\n%s", name, out)
		}
	}
	if exists(export) {
		t.Error("the ServiceExport shop/web outlived its CRD")
	}
}

// cleanup --node with the token of a ServiceAccount that may do nothing
// is refused at its first request, naming it, and makes no Job.
func TestCleanupJobRefused(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cleanupjob", harness.ControlPlaneOptions{})
	nobody := serviceAccountKubeconfig(t, cp, "default", "nobody")
	code, out, errOut := flotilla("cleanup", "--kubeconfig", nobody, "--node", "gw")
	if code == 0 || !strings.Contains(errOut, `nodes "gw" is forbidden: User "system:serviceaccount:default:nobody"`) {
		t.Fatalf("cleanup --node as nobody: exit %d\n%s%s", code, out, errOut)
	}
	jobs, err := cp.Client.BatchV1().Jobs("kube-system").List(t.Context(), metav1.ListOptions{})
	if err != nil || len(jobs.Items) > 0 {
		t.Errorf("jobs in kube-system after a refused cleanup: %v, %v", jobs, err)
	}
}
