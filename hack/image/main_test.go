package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// The command `make image` runs writes an image whose entrypoint is the
// binary, for linux/amd64, holding the binary and /tmp, under the tag
// asked for.
func TestMakeImageReadsBack(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/flotilla-io/flotilla/test/images/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	file := filepath.Join(dir, "image.tar")
	var out strings.Builder
	if err := run([]string{"-binary", bin, "-path", "/flotilla", "-tag", "flotilla:v9", "-o", file}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "image ID sha256:") {
		t.Errorf("output %q names no image ID", out.String())
	}
	img, err := ociimage.Read(file, "flotilla:v9")
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS+"/"+cf.Architecture != "linux/amd64" || !slices.Equal(cf.Config.Entrypoint, []string{"/flotilla"}) {
		t.Errorf("platform %s/%s, entrypoint %q; want linux/amd64 and /flotilla", cf.OS, cf.Architecture, cf.Config.Entrypoint)
	}
	files, err := ociimage.Files(img)
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := files["/flotilla"]; !ok || f.Mode != 0o755 || !files["/tmp"].Dir || len(files) != 2 {
		t.Errorf("image files %+v, want the executable /flotilla and /tmp", files)
	}
	if err := run([]string{"-binary", bin, "-o", file}, io.Discard); err == nil {
		t.Error("missing -path and -tag accepted")
	}

	// The same for another platform: the image says it is arm64's.
	if err := run([]string{"-binary", bin, "-platform", "linux/arm64", "-path", "/flotilla", "-tag", "flotilla:v9", "-o", file}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if img, err = ociimage.Read(file, "flotilla:v9"); err != nil {
		t.Fatal(err)
	}
	if cf, err = img.ConfigFile(); err != nil {
		t.Fatal(err)
	}
	if cf.OS+"/"+cf.Architecture != "linux/arm64" {
		t.Errorf("-platform linux/arm64: image for %s/%s", cf.OS, cf.Architecture)
	}
}
