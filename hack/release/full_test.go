//go:build release

package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/internal/version"
)

// `make release` itself, the whole binary for every platform: minutes per
// platform, so behind the build tag release (`make release-test`).
func TestFullRelease(t *testing.T) {
	root := moduleRoot(t)
	dir := filepath.Join(t.TempDir(), "v0.0.0-test")
	cmd := exec.Command("make", "release", "VERSION=v0.0.0-test", "ALLOW_DIRTY=1", "RELEASE_DIR="+dir)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	t.Logf("make release:\n%s", out)
	if err != nil {
		t.Fatalf("make release: %v", err)
	}
	checkRelease(t, dir, "v0.0.0-test", deployImage, filepath.Join(root, pluginLicense), func(t *testing.T, bin string) version.Info {
		out, err := exec.Command(bin, "version").Output()
		if err != nil {
			t.Fatalf("%s version: %v", bin, err)
		}
		t.Logf("%s version:\n%s", filepath.Base(bin), out)
		var got version.Info
		for line := range strings.Lines(string(out)) {
			key, value, _ := strings.Cut(strings.TrimSpace(line), ":")
			switch value = strings.TrimSpace(value); key {
			case "version":
				got.Version = value
			case "commit":
				got.Commit = value
			case "date":
				got.Date = value
			}
		}
		return got
	})
}
