package harness

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// Images every real node has: they are built from this checkout (static
// binaries on an empty base) and imported into each node's containerd, so
// pods run without a registry. Pods that use them set imagePullPolicy
// Never.
const (
	// PauseImage holds every pod's namespaces (containerd's sandbox image).
	PauseImage = "flotilla.local/pause:1"
	// TestServerImage runs test/images/testserver: TCP on TestServerTCPPort
	// (one line in, the peer address it sees, its pod's name and UID out:
	// ParseHello) and HTTP on TestServerHTTPPort (/hostname, /peer, and
	// "/" with all three).
	TestServerImage = "flotilla.local/testserver:1"

	TestServerTCPPort  = 9000
	TestServerHTTPPort = 8080
)

// TestServerUID gives a test server container its pod's UID (the downward
// API), which it reports at "/": the UID names one pod of one cluster,
// where pod names and addresses repeat across clusters.
var TestServerUID = corev1.EnvVar{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}}

type imageBuild struct {
	once sync.Once
	path string
	err  error
}

var imageBuilds = map[string]*imageBuild{
	PauseImage:      {},
	TestServerImage: {},
}

var imageSources = map[string]struct{ pkg, path string }{
	PauseImage:      {"github.com/flotilla-io/flotilla/test/images/pause", "/pause"},
	TestServerImage: {"github.com/flotilla-io/flotilla/test/images/testserver", "/testserver"},
}

// ImageTarball builds one of the harness's images (PauseImage,
// TestServerImage) once per test binary and returns its tarball, in the
// cache outside the git tree.
func ImageTarball(t TB, image string) string {
	t.Helper()
	path, err := imageTarball(image)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return path
}

func imageTarball(image string) (string, error) {
	b, ok := imageBuilds[image]
	if !ok {
		return "", fmt.Errorf("no harness image %q (want %s or %s)", image, PauseImage, TestServerImage)
	}
	b.once.Do(func() { b.path, b.err = buildImage(image) })
	return b.path, b.err
}

// TestServerImageAs builds TestServerImage under another name, once per
// name and test binary, and returns its tarball: a stand-in, on nodes
// without a registry, for an image a document names that serves HTTP on
// TestServerHTTPPort too.
func TestServerImageAs(t TB, name string) string {
	t.Helper()
	renamedMu.Lock()
	b, ok := renamed[name]
	if !ok {
		b = &imageBuild{}
		renamed[name] = b
	}
	renamedMu.Unlock()
	b.once.Do(func() { b.path, b.err = buildImageAs(imageSources[TestServerImage], name) })
	if b.err != nil {
		t.Fatalf("harness: %v", b.err)
	}
	return b.path
}

var (
	renamedMu sync.Mutex
	renamed   = map[string]*imageBuild{}
)

func buildImage(image string) (string, error) {
	return buildImageAs(imageSources[image], image)
}

func buildImageAs(src struct{ pkg, path string }, image string) (string, error) {
	dir := filepath.Join(CacheDir(), "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := filepath.Base(src.path)
	// One file per name: the same binary may be built under two at once.
	sum := sha256.Sum256([]byte(image))
	tagSum := hex.EncodeToString(sum[:4])
	bin := filepath.Join(dir, fmt.Sprintf("%s-%s-%d", base, tagSum, os.Getpid()))
	defer os.Remove(bin)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, src.pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v: %s", src.pkg, err, bytes.TrimSpace(out))
	}
	img, err := ociimage.Build(ociimage.Spec{Binary: bin, Path: src.path})
	if err != nil {
		return "", fmt.Errorf("image %s: %w", image, err)
	}
	// Named after the test process, like the flotilla binary: Sweep
	// removes those of processes that are gone.
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.tar", base, tagSum, os.Getpid()))
	if err := ociimage.Write(path, image, img); err != nil {
		return "", err
	}
	return path, nil
}
