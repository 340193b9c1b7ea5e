package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

const (
	chartDir = "../charts/flotilla"
	// helmRelease is the release's name and helmNamespace where Helm keeps
	// its record: not flotilla-system, which the chart itself creates
	// (and Helm's record must exist before the chart's objects do).
	helmRelease   = "flotilla"
	helmNamespace = "default"
)

// sharedCRDs are the CRDs other implementations share, in the chart's
// crds/: Helm installs them and never deletes them.
var sharedCRDs = []string{"clusterproperties.about.k8s.io", "serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"}

// TestHelmInstall drives charts/flotilla with helm itself (built from
// Helm's module source) against a real control plane: lint, install
// (every object as `kubectl apply -k deploy/` would make it), upgrade with
// changed values (the change reaches the Deployment), uninstall (nothing
// of the release is left; the shared CRDs and an object of another
// implementation in them stay).
func TestHelmInstall(t *testing.T) {
	harness.Require(t, append(slices.Clone(harness.NeedsControlPlane), harness.Helm)...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	h := helmCLI{t: t, cp: cp, home: t.TempDir()}

	if out := h.run("lint", chartDir); !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") || strings.Contains(out, "[ERROR]") {
		t.Fatalf("helm lint:\n%s", out)
	}

	// The release's record cannot live in the namespace the chart itself
	// creates (docs/install.md): refused before any object of the
	// release is made (Helm installs crds/ first, which stay).
	if out, err := h.try("install", helmRelease, chartDir, "--namespace", namespace); err == nil || !strings.Contains(out, `namespaces "flotilla-system" not found`) {
		t.Fatalf("helm install --namespace %s: %v, want it refused for want of the namespace:\n%s", namespace, err, out)
	}
	for _, obj := range []string{"namespace/" + namespace, "crd/" + crdName} {
		if out, err := kubectl(cp, "get", obj); err == nil || !strings.Contains(out, "NotFound") {
			t.Fatalf("%s after the refused install: %v\n%s", obj, err, out)
		}
	}

	t.Logf("helm install:\n%s", h.run("install", helmRelease, chartDir, "--namespace", helmNamespace))
	objs := h.manifest()
	want := kustomizeObjects(t, ".")
	t.Run("installs deploy/'s objects", func(t *testing.T) { testHelmObjects(t, cp, objs, want) })
	t.Run("upgrade applies changed values", func(t *testing.T) { testHelmUpgrade(t, cp, h) })
	t.Run("uninstall leaves only the shared CRDs", func(t *testing.T) { testHelmUninstall(t, cp, h, objs) })
}

// helmCLI runs helm against cp with a home of its own.
type helmCLI struct {
	t    *testing.T
	cp   *harness.ControlPlane
	home string
}

func (h helmCLI) run(args ...string) string {
	h.t.Helper()
	out, err := h.try(args...)
	if err != nil {
		h.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// try runs helm and returns what it printed and how it exited.
func (h helmCLI) try(args ...string) (string, error) {
	cmd := exec.Command(harness.HelmBinary(), append(args, "--kubeconfig", h.cp.Kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+h.home+"/cache", "HELM_CONFIG_HOME="+h.home+"/config", "HELM_DATA_HOME="+h.home+"/data")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// manifest is what the release installed besides crds/, as Helm recorded
// it, keyed as kustomizeObjects keys.
func (h helmCLI) manifest() map[string]map[string]any {
	h.t.Helper()
	return parseObjects(h.t, h.run("get", "manifest", helmRelease, "--namespace", helmNamespace))
}

// kustomizeObjects renders dir as `kubectl apply -k` would.
func kustomizeObjects(t *testing.T, dir string) map[string]map[string]any {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return parseObjects(t, string(out))
}

// parseObjects reads YAML documents into objects keyed "kind
// namespace/name", through JSON so that numbers compare alike.
func parseObjects(t *testing.T, all string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range strings.Split(all, "\n---") {
		raw, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		var o map[string]any
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatal(err)
		}
		if len(o) == 0 {
			continue
		}
		out[objectKey(o)] = o
	}
	return out
}

func objectKey(o map[string]any) string {
	u := unstructured.Unstructured{Object: o}
	return fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
}

// liveClient gets any object of cp by its kind.
type liveClient struct {
	mapper meta.RESTMapper
	dyn    dynamic.Interface
}

func newLiveClient(cp *harness.ControlPlane) liveClient {
	disc := memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config))
	return liveClient{restmapper.NewDeferredDiscoveryRESTMapper(disc), dynamic.NewForConfigOrDie(cp.Config)}
}

func (c liveClient) get(t *testing.T, o map[string]any) (*unstructured.Unstructured, error) {
	t.Helper()
	u := unstructured.Unstructured{Object: o}
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", gvk, err)
	}
	return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace()).Get(t.Context(), u.GetName(), metav1.GetOptions{})
}

// The release holds exactly deploy/'s objects less the shared CRDs
// (crds/), and each is in the cluster with every field deploy/ sets:
// Helm's own label and annotations are the only difference.
func testHelmObjects(t *testing.T, cp *harness.ControlPlane, release, want map[string]map[string]any) {
	live := newLiveClient(cp)
	for key, o := range want {
		crd := strings.HasPrefix(key, "CustomResourceDefinition ")
		shared := crd && slices.Contains(sharedCRDs, (&unstructured.Unstructured{Object: o}).GetName())
		if _, ok := release[key]; ok == shared {
			t.Errorf("%s: in the release %v, want %v (only the shared CRDs are outside it)", key, ok, !shared)
		}
		got, err := live.get(t, o)
		if err != nil {
			t.Errorf("%s after helm install: %v", key, err)
			continue
		}
		expect := o
		if !shared {
			// Helm marks what it installs as its own.
			expect = withHelmMetadata(o)
		}
		if diff := subsetDiff("", normalized(t, expect), normalized(t, got.Object)); diff != "" {
			t.Errorf("%s differs from deploy/'s: %s", key, diff)
		}
	}
	for key := range release {
		if _, ok := want[key]; !ok {
			t.Errorf("the release installs %s, which deploy/ does not", key)
		}
	}
	if len(want) < 20 {
		t.Errorf("deploy/ rendered %d objects; the comparison saw too little", len(want))
	}
}

// withHelmMetadata is o as Helm writes it: labelled managed-by Helm and
// annotated with its release.
func withHelmMetadata(o map[string]any) map[string]any {
	u := unstructured.Unstructured{Object: o}
	u = *u.DeepCopy()
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["app.kubernetes.io/managed-by"] = "Helm"
	u.SetLabels(labels)
	ann := u.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann["meta.helm.sh/release-name"] = helmRelease
	ann["meta.helm.sh/release-namespace"] = helmNamespace
	u.SetAnnotations(ann)
	return u.Object
}

// normalized is v through JSON with the whitespace of every string
// collapsed: kustomize keeps one more line break than Helm before a
// more-indented line of a folded scalar (the policies' CEL expressions),
// where whitespace means nothing.
func normalized(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	var collapse func(any) any
	collapse = func(v any) any {
		switch v := v.(type) {
		case string:
			return strings.Join(strings.Fields(v), " ")
		case map[string]any:
			for k, e := range v {
				v[k] = collapse(e)
			}
		case []any:
			for i, e := range v {
				v[i] = collapse(e)
			}
		}
		return v
	}
	return collapse(out)
}

// subsetDiff says where want is not within got: every field want sets
// must be in got with the same value (the API server adds defaults).
func subsetDiff(path string, want, got any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: %v, want an object", path, got)
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				if v == nil {
					continue
				}
				return fmt.Sprintf("%s.%s missing (want %v)", path, k, v)
			}
			if d := subsetDiff(path+"."+k, v, gv); d != "" {
				return d
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
		for i := range w {
			if d := subsetDiff(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
				return d
			}
		}
	default:
		if want != got {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
	}
	return ""
}

// helm upgrade with replicas 1 and Segregated traffic: the Deployment in
// the cluster runs one agent replaced by Recreate, without leader
// election, with --traffic=Segregated.
func testHelmUpgrade(t *testing.T, cp *harness.ControlPlane, h helmCLI) {
	t.Logf("helm upgrade:\n%s", h.run("upgrade", helmRelease, chartDir, "--namespace", helmNamespace, "--set", "replicas=1", "--set", "traffic=Segregated"))
	d, err := cp.Client.AppsV1().Deployments(namespace).Get(t.Context(), "flotilla-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := d.Spec.Template.Spec.Containers[0].Args
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != "Recreate" || !slices.Contains(args, "--traffic=Segregated") || slices.Contains(args, "--leader-elect") {
		t.Errorf("after helm upgrade: replicas %d, strategy %s, args %q; want 1, Recreate, --traffic=Segregated and no --leader-elect",
			*d.Spec.Replicas, d.Spec.Strategy.Type, args)
	}
	if d.Labels["app.kubernetes.io/managed-by"] != "Helm" || d.Annotations["meta.helm.sh/release-name"] != helmRelease {
		t.Errorf("after helm upgrade the Deployment is not the release's: labels %v, annotations %v", d.Labels, d.Annotations)
	}
	if out := h.run("history", helmRelease, "--namespace", helmNamespace); !strings.Contains(out, "Upgrade complete") {
		t.Errorf("helm history after the upgrade:\n%s", out)
	}
}

// helm uninstall removes every object of the release, Flotilla's own
// CRDs with their objects included; the shared CRDs stay, with a
// ServiceExport another implementation made in one.
func testHelmUninstall(t *testing.T, cp *harness.ControlPlane, h helmCLI, release map[string]map[string]any) {
	export := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
		"metadata": map[string]any{"name": "another-implementations", "namespace": "default"},
	}}
	if out, err := kubectlStdin(cp, export, "create", "-f", "-"); err != nil {
		t.Fatalf("create a ServiceExport: %v\n%s", err, out)
	}
	peer := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flotilla.io/v1alpha1", "kind": "Peer", "metadata": map[string]any{"name": "c-beta"},
	}}
	if out, err := kubectlStdin(cp, peer, "create", "-f", "-"); err != nil {
		t.Fatalf("create a Peer: %v\n%s", err, out)
	}

	t.Logf("helm uninstall:\n%s", h.run("uninstall", helmRelease, "--namespace", helmNamespace, "--wait", "--timeout", "2m"))
	live := newLiveClient(cp)
	eventually.Within(t, 90*time.Second, "every object of the release gone", func() error {
		for key, o := range release {
			if _, err := live.get(t, o); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s after helm uninstall: %v", key, err)
			}
		}
		return nil
	})
	for _, name := range sharedCRDs {
		if out, err := kubectl(cp, "get", "crd", name); err != nil {
			t.Errorf("shared CRD %s after helm uninstall: %v\n%s", name, err, out)
		}
	}
	if out, err := kubectl(cp, "-n", "default", "get", "serviceexport", "another-implementations"); err != nil {
		t.Errorf("another implementation's ServiceExport after helm uninstall: %v\n%s", err, out)
	}
	if out := h.run("list", "--all", "--namespace", helmNamespace, "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("helm list after uninstall: %q, want no release", out)
	}
	if out, err := kubectl(cp, "-n", "default", "delete", "serviceexport", "another-implementations"); err != nil {
		t.Errorf("delete the ServiceExport: %v\n%s", err, out)
	}
}

// kubectlStdin runs kubectl with o as its standard input.
func kubectlStdin(cp *harness.ControlPlane, o *unstructured.Unstructured, args ...string) (string, error) {
	raw, err := json.Marshal(o.Object)
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(string(raw))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// subsetDiff finds every way a live object can differ from what deploy/
// sets, and takes the API server's defaults for no difference.
func TestSubsetDiff(t *testing.T) {
	want := map[string]any{"a": "x", "b": []any{1.0, map[string]any{"c": true}}, "d": nil}
	for _, tc := range []struct {
		got  any
		same bool
	}{
		{map[string]any{"a": "x", "b": []any{1.0, map[string]any{"c": true}}}, true},
		{map[string]any{"a": "x", "b": []any{1.0, map[string]any{"c": true, "default": 3.0}}, "e": "added"}, true},
		{map[string]any{"a": "y", "b": []any{1.0, map[string]any{"c": true}}}, false},
		{map[string]any{"b": []any{1.0, map[string]any{"c": true}}}, false},
		{map[string]any{"a": "x", "b": []any{1.0}}, false},
		{map[string]any{"a": "x", "b": []any{1.0, map[string]any{"c": false}}}, false},
		{map[string]any{"a": "x", "b": "not a list"}, false},
		{"not an object", false},
	} {
		if d := subsetDiff("", want, tc.got); (d == "") != tc.same {
			t.Errorf("subsetDiff(%v, %v) = %q, want a difference: %v", want, tc.got, d, !tc.same)
		}
	}
}
