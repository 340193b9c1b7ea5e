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
