package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

var flotillaImage struct {
	once sync.Once
	img  v1.Image
	err  error

	mu       sync.Mutex
	tarballs map[string]string // by tag
}

// FlotillaImage builds the agent's image from this checkout, as `make
// image` does (the static binary at /flotilla and an empty /tmp on an
// empty base), tags it tag (e.g. "flotilla.local/flotilla:test-<run>") and
// returns its tarball, for NodeOptions.Images. The binary is built once per
// test binary; pods using the image set imagePullPolicy Never.
func FlotillaImage(t TB, tag string) string {
	t.Helper()
	path, err := flotillaImageTarball(tag)
	if err != nil {
		t.Fatalf("harness: flotilla image %s: %v", tag, err)
	}
	return path
}

func flotillaImageTarball(tag string) (string, error) {
	b := &flotillaImage
	b.once.Do(func() { b.img, b.err = buildFlotillaImage() })
	if b.err != nil {
		return "", b.err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if path, ok := b.tarballs[tag]; ok {
		return path, nil
	}
	// Named after the test process, like the other images: Sweep removes
	// those of processes that are gone.
	safe := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' {
			return r
		}
		return '_'
	}, strings.ToLower(tag))
	path := filepath.Join(CacheDir(), "images", fmt.Sprintf("flotilla_%s-%d.tar", safe, os.Getpid()))
	if err := ociimage.Write(path, tag, b.img); err != nil {
		return "", err
	}
	if b.tarballs == nil {
		b.tarballs = map[string]string{}
	}
	b.tarballs[tag] = path
	return path, nil
}

func buildFlotillaImage() (v1.Image, error) {
	dir := filepath.Join(CacheDir(), "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, fmt.Sprintf("flotilla-linux-amd64-%d", os.Getpid()))
	defer os.Remove(bin)
	if err := buildImageBinary(bin); err != nil {
		return nil, err
	}
	// Build holds the binary in memory: the file may go.
	return ociimage.Build(ociimage.Spec{Binary: bin, Path: "/flotilla", Dirs: []string{"/tmp"}})
}

// buildImageBinary builds the flotilla binary to path as `make image`
// does: static (the image has no libc; Flotilla's own binary may use
// cgo), its paths trimmed, without symbol table or debug data.
func buildImageBinary(path string) error {
	return buildFlotilla(path, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, releaseFlags...)
}

// ImageBinary builds the binary the agent's image holds (buildImageBinary)
// and returns its path, in the cache and named after the test process,
// removed at t's cleanup: what a measure of the deployed agent's memory
// runs, since a binary with cgo maps libc besides.
func ImageBinary(t TB) string {
	t.Helper()
	dir := filepath.Join(CacheDir(), "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("harness: %v", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("flotilla-image-%d", os.Getpid()))
	t.Cleanup(func() { os.Remove(path) })
	if err := buildImageBinary(path); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return path
}
