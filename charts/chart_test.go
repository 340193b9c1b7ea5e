// Package charts_test checks the Helm chart charts/flotilla against the
// kustomize install it must equal. A module of its own: Helm's Go packages
// need a newer Kubernetes client than the agent's.
package charts_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// object is one manifest, parsed.
type object = map[string]any

// renderChart renders charts/flotilla as `helm install flotilla -n
// flotilla-system` would with values, its crds/ first.
func renderChart(t *testing.T, values map[string]any) map[string]object {
	t.Helper()
	return render(t, values, true)
}

// renderChartTemplates renders the templates alone, without crds/.
func renderChartTemplates(t *testing.T, values map[string]any) map[string]object {
	t.Helper()
	return render(t, values, false)
}

func render(t *testing.T, values map[string]any, withCRDs bool) map[string]object {
	t.Helper()
	c, err := loader.Load("flotilla")
	if err != nil {
		t.Fatal(err)
	}
	if err := chartutil.ProcessDependencies(c, values); err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(c, values, chartutil.ReleaseOptions{Name: "flotilla", Namespace: "flotilla-system", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := engine.Render(c, vals)
	if err != nil {
		t.Fatalf("render charts/flotilla: %v", err)
	}
	var docs []string
	for _, crd := range c.CRDObjects() {
		if withCRDs {
			docs = append(docs, string(crd.File.Data))
		}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range rendered {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		docs = append(docs, rendered[n])
	}
	return parse(t, strings.Join(docs, "\n---\n"))
}

// renderKustomize renders dir as `kubectl apply -k` would.
func renderKustomize(t *testing.T, dir string) map[string]object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, string(out))
}

// parse splits YAML documents into objects keyed kind namespace/name,
// through JSON so numbers and maps compare alike whoever wrote them, with
// the whitespace in strings collapsed (collapseSpace).
func parse(t *testing.T, all string) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, doc := range strings.Split(all, "\n---") {
		raw, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		var o object
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatal(err)
		}
		if len(o) == 0 {
			continue
		}
		o = collapseSpace(o).(object)
		meta, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%v %v/%v", o["kind"], meta["namespace"], meta["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = o
	}
	return out
}

// With its default values the chart installs exactly the objects of
// `kubectl apply -k deploy/`, field for field.
func TestChartEqualsKustomize(t *testing.T) {
	chart := renderChart(t, map[string]any{})
	kustomize := renderKustomize(t, "../deploy")
	for _, key := range sortedKeys(kustomize) {
		got, ok := chart[key]
		if !ok {
			t.Errorf("the chart lacks %s", key)
			continue
		}
		if !reflect.DeepEqual(got, kustomize[key]) {
			a, _ := yaml.Marshal(got)
			b, _ := yaml.Marshal(kustomize[key])
			t.Errorf("%s differs:\nchart:\n%s\nkustomize:\n%s", key, a, b)
		}
	}
	for _, key := range sortedKeys(chart) {
		if _, ok := kustomize[key]; !ok {
			t.Errorf("the chart installs %s, which deploy/ does not", key)
		}
	}
	if len(kustomize) < 20 {
		t.Errorf("deploy/ rendered %d objects; the comparison saw too little", len(kustomize))
	}
}

// The values set what their comments say, and nothing else changes.
func TestChartValues(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	chart := renderChart(t, map[string]any{
		"image":            map[string]any{"repository": "registry.example/flotilla", "digest": digest},
		"gatewayNodeLabel": "example.org/edge",
		"clusterName":      "east",
		"clusterLabels":    map[string]any{"region": "eu"},
		"traffic":          "Segregated",
		"offloadGrants":    "auto",
		"corednsForward":   "kube-system/coredns",
		"gatewayService":   "NodePort",
		"extraArgs":        []any{"--log-level=debug"},
	})
	d := chart["Deployment flotilla-system/flotilla-agent"]
	spec := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	agent := spec["containers"].([]any)[0].(map[string]any)
	if got, want := agent["image"], "registry.example/flotilla@"+digest; got != want {
		t.Errorf("image %v, want %s", got, want)
	}
	if got := spec["nodeSelector"]; !reflect.DeepEqual(got, map[string]any{"example.org/edge": "true"}) {
		t.Errorf("nodeSelector %v, want example.org/edge=true", got)
	}
	var args []string
	for _, a := range agent["args"].([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"agent", "--fabric-owner=flotilla-agent", "--cluster-name=east", "--cluster-label=region=eu",
		"--traffic=Segregated", "--offload-grants=auto", "--coredns-forward=kube-system/coredns", "--gateway-service=NodePort", "--log-level=debug"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	forward := renderKustomize(t, "../deploy/coredns-forward")
	for key, o := range forward {
		if !reflect.DeepEqual(chart[key], o) {
			t.Errorf("corednsForward set: the chart lacks or changes %s", key)
		}
	}
	if len(forward) == 0 {
		t.Error("deploy/coredns-forward rendered nothing")
	}
	if len(chart) != len(renderChart(t, map[string]any{}))+len(forward) {
		t.Errorf("the values added %d objects, want deploy/coredns-forward's %d", len(chart)-len(renderChart(t, map[string]any{})), len(forward))
	}
}

// replicas: 1 runs one agent without leader election, replaced by
// Recreate; nothing else of the Deployment changes.
func TestChartOneReplica(t *testing.T) {
	one := renderChart(t, map[string]any{"replicas": 1})["Deployment flotilla-system/flotilla-agent"]
	two := renderChart(t, map[string]any{})["Deployment flotilla-system/flotilla-agent"]
	spec := one["spec"].(map[string]any)
	if got := spec["replicas"]; got != float64(1) {
		t.Errorf("replicas %v, want 1", got)
	}
	if got := spec["strategy"]; !reflect.DeepEqual(got, map[string]any{"type": "Recreate"}) {
		t.Errorf("strategy %v, want Recreate", got)
	}
	args := func(d object) []any {
		pod := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		return pod["containers"].([]any)[0].(map[string]any)["args"].([]any)
	}
	if slices.Contains(args(one), any("--leader-elect")) || !slices.Contains(args(two), any("--leader-elect")) {
		t.Errorf("args with one replica %v, with two %v; want --leader-elect with two only", args(one), args(two))
	}
	oneSpec, twoSpec := maps.Clone(spec), maps.Clone(two["spec"].(map[string]any))
	for _, s := range []map[string]any{oneSpec, twoSpec} {
		delete(s, "replicas")
		delete(s, "strategy")
		pod := s["template"].(map[string]any)["spec"].(map[string]any)
		c := pod["containers"].([]any)[0].(map[string]any)
		c["args"] = slices.DeleteFunc(slices.Clone(c["args"].([]any)), func(a any) bool { return a == "--leader-elect" })
	}
	if !reflect.DeepEqual(oneSpec, twoSpec) {
		t.Error("replicas: 1 changed more of the Deployment than its replicas, strategy and --leader-elect")
	}
}

func sortedKeys(m map[string]object) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// collapseSpace collapses every run of whitespace in the strings of v to
// one space. Kustomize's YAML reader keeps one more line break than
// Helm's (and kubectl apply -f's) before a more-indented line of a folded
// scalar, as in the admission policies' CEL expressions, where whitespace
// means nothing.
func collapseSpace(v any) any {
	switch v := v.(type) {
	case string:
		return strings.Join(strings.Fields(v), " ")
	case map[string]any:
		for k, e := range v {
			v[k] = collapseSpace(e)
		}
	case []any:
		for i, e := range v {
			v[i] = collapseSpace(e)
		}
	}
	return v
}

// Helm installs crds/ before everything and never changes or deletes
// what is there: only the CRDs other implementations share (MCS,
// ClusterProperty) belong there. Flotilla's own are templates, upgraded
// and uninstalled with the release.
func TestChartKeepsOnlySharedCRDs(t *testing.T) {
	c, err := loader.Load("flotilla")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, crd := range c.CRDObjects() {
		kept = append(kept, crd.Name)
	}
	sort.Strings(kept)
	want := []string{"crds/about.k8s.io_clusterproperties.yaml", "crds/multicluster.x-k8s.io_serviceexports.yaml", "crds/multicluster.x-k8s.io_serviceimports.yaml"}
	if !slices.Equal(kept, want) {
		t.Errorf("crds/ holds %v, want the shared CRDs %v only", kept, want)
	}
	var owned []string
	for key := range renderChartTemplates(t, map[string]any{}) {
		if strings.HasPrefix(key, "CustomResourceDefinition ") {
			owned = append(owned, key)
		}
	}
	sort.Strings(owned)
	if want := []string{
		"CustomResourceDefinition <nil>/namespaceoffloads.flotilla.io",
		"CustomResourceDefinition <nil>/namespacerequests.flotilla.io",
		"CustomResourceDefinition <nil>/peers.flotilla.io",
	}; !slices.Equal(owned, want) {
		t.Errorf("the templates hold the CRDs %v, want Flotilla's own %v", owned, want)
	}
}

// monitoring.enabled adds deploy/monitoring's objects, as kustomize
// renders them, and nothing else; off by default.
func TestChartMonitoring(t *testing.T) {
	monitoring := renderKustomize(t, "../deploy/monitoring")
	kinds := map[string]int{}
	for _, o := range monitoring {
		kinds[o["kind"].(string)]++
	}
	if kinds["PodMonitor"] != 2 || kinds["PrometheusRule"] != 1 {
		t.Errorf("deploy/monitoring renders %v, want the two PodMonitors and a PrometheusRule", kinds)
	}
	off := renderChart(t, map[string]any{})
	on := renderChart(t, map[string]any{"monitoring": map[string]any{"enabled": true}})
	for key, o := range monitoring {
		if _, ok := off[key]; ok {
			t.Errorf("the chart installs %s by default", key)
		}
		if !reflect.DeepEqual(on[key], o) {
			t.Errorf("monitoring.enabled: the chart lacks or changes %s", key)
		}
	}
	if len(on) != len(off)+len(monitoring) {
		t.Errorf("monitoring.enabled added %d objects, want deploy/monitoring's %d", len(on)-len(off), len(monitoring))
	}
}
