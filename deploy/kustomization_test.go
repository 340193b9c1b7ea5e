package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// `kubectl apply -k deploy/` installs every manifest in deploy/: a file
// added but not listed would silently not be installed.
func TestKustomizationListsEveryManifest(t *testing.T) {
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	var files []string
	for _, pattern := range []string{"*.yaml", "crds/*.yaml"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" })
	slices.Sort(files)
	listed := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(files, listed) {
		t.Errorf("kustomization.yaml lists %v; deploy/ holds %v", listed, files)
	}
}
