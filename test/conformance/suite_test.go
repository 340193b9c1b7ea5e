package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A directory that is not the suite's is refused before anything is
// copied or built, with what MCS_CONFORMANCE should name.
func TestBuildSuiteRefusesOtherDirectories(t *testing.T) {
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"no go.mod": t.TempDir(), "another module": other, "missing": filepath.Join(other, "nope")} {
		t.Run(name, func(t *testing.T) {
			cache := t.TempDir()
			_, err := BuildSuite(src, cache)
			if err == nil || !strings.Contains(err.Error(), "MCS_CONFORMANCE") {
				t.Errorf("error %v, want one naming MCS_CONFORMANCE", err)
			}
			if entries, _ := os.ReadDir(cache); len(entries) != 0 {
				t.Errorf("the cache holds %d entries after a refusal", len(entries))
			}
		})
	}
}

// The suite is built with the project's own versions of the Kubernetes
// modules, each named once, as go.mod requires it.
func TestProjectVersions(t *testing.T) {
	got, err := ProjectVersions(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(SharedModules) {
		t.Fatalf("versions %v, want one for each of %v", got, SharedModules)
	}
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for i, pv := range got {
		path, version, ok := strings.Cut(pv, "@")
		if !ok || path != SharedModules[i] || !strings.HasPrefix(version, "v") {
			t.Errorf("%q: want %s@<version>", pv, SharedModules[i])
			continue
		}
		if !strings.Contains(string(mod), "\t"+path+" "+version+"\n") {
			t.Errorf("%s: go.mod does not require %s", pv, version)
		}
	}
}
