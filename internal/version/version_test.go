package version_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/flotilla-io/flotilla/internal/version"
)

// The flags `make build` and `make release` link with reach the build a
// binary reports; without them it says it is a development build.
func TestLinkerStampsTheBuild(t *testing.T) {
	const pkg = "github.com/flotilla-io/flotilla/internal/version"
	for _, tc := range []struct {
		name    string
		ldflags string
		want    version.Info
	}{
		{"stamped", "-X " + pkg + ".Version=v1.2.3 -X " + pkg + ".Commit=0123abcd -X " + pkg + ".Date=2026-01-02T03:04:05Z",
			version.Info{Version: "v1.2.3", Commit: "0123abcd", Date: "2026-01-02T03:04:05Z"}},
		{"plain go build", "", version.Info{Version: "dev", Commit: "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "printversion")
			build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", tc.ldflags, "-o", bin, "./testdata/printversion")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatalf("%s: %v", bin, err)
			}
			var got version.Info
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%s printed %q: %v", bin, out, err)
			}
			tc.want.GoVersion, tc.want.Platform = runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
			if got != tc.want {
				t.Errorf("build %+v, want %+v", got, tc.want)
			}
		})
	}
}
