package ociimage_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// staticBinary builds the test pause program as a static binary, a small
// stand-in for the agent's binary.
func staticBinary(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/flotilla-io/flotilla/test/images/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, b)
	}
	return out
}

// An image written to a tarball reads back with its entrypoint, platform
// and exactly the files asked for, the binary intact.
func TestImageReadsBack(t *testing.T) {
	bin := staticBinary(t)
	img, err := ociimage.Build(ociimage.Spec{Binary: bin, Path: "/bin/agent", Cmd: []string{"serve"}, Env: []string{"MODE=test"}, Dirs: []string{"/tmp"}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.Write(file, "flotilla:test", img); err != nil {
		t.Fatal(err)
	}
	back, err := ociimage.Read(file, "flotilla:test")
	if err != nil {
		t.Fatal(err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/bin/agent"}) || !slices.Equal(cf.Config.Cmd, []string{"serve"}) || !slices.Equal(cf.Config.Env, []string{"MODE=test"}) {
		t.Errorf("entrypoint %q cmd %q env %q", cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env)
	}
	if !cf.Created.Time.Equal(ociimage.Epoch) {
		t.Errorf("created %s, want the fixed %s", cf.Created.Time, ociimage.Epoch)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	files, err := ociimage.Files(back)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := []string{"/bin", "/bin/agent", "/tmp"}; !slices.Equal(names, want) {
		t.Fatalf("image holds %q, want %q", names, want)
	}
	if f := files["/bin/agent"]; f.Dir || f.Mode != 0o755 || !f.ModTime.Equal(ociimage.Epoch) {
		t.Errorf("/bin/agent: %+v, want an executable file stamped %s", f, ociimage.Epoch)
	}
	want, _ := os.ReadFile(bin)
	if got := fileContent(t, back, "bin/agent"); !bytes.Equal(got, want) {
		t.Errorf("the binary in the image differs from the one built (%d bytes, want %d)", len(got), len(want))
	}
}

// fileContent returns the content of a file in img's flattened layers.
func fileContent(t *testing.T, img v1.Image, name string) []byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the image: %v", name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// The same binary gives the same image, byte for byte, whenever it is built.
func TestImageIsReproducible(t *testing.T) {
	bin := staticBinary(t)
	var digests []string
	for range 2 {
		img, err := ociimage.Build(ociimage.Spec{Binary: bin, Path: "/pause"})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
		// Touching the file changes its time on disk, not the image.
		os.Chtimes(bin, ociimage.Epoch.AddDate(1, 0, 0), ociimage.Epoch.AddDate(1, 0, 0))
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds of one binary differ: %s and %s", digests[0], digests[1])
	}
}

// Bad specifications are refused with an error naming the problem.
func TestImageRefusesBadSpecs(t *testing.T) {
	bin := staticBinary(t)
	for _, s := range []ociimage.Spec{
		{Binary: bin, Path: "pause"},
		{Binary: bin, Path: "/a/../pause"},
		{Binary: filepath.Join(t.TempDir(), "missing"), Path: "/pause"},
		{Binary: bin, Path: "/pause", Dirs: []string{"tmp"}},
	} {
		if _, err := ociimage.Build(s); err == nil {
			t.Errorf("Build(%+v) succeeded, want an error", s)
		}
	}
	img, _ := ociimage.Build(ociimage.Spec{Binary: bin, Path: "/pause"})
	if err := ociimage.Write(filepath.Join(t.TempDir(), "x.tar"), "Not A Tag!", img); err == nil {
		t.Error("Write with an invalid tag succeeded")
	}
}
