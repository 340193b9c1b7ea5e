package harness

import (
	_ "embed"
	"os"
	"path/filepath"
	"strings"
)

//go:embed kube-version
var kubeVersionFile string

// KubeVersion is the pinned Kubernetes release the control planes run. The
// build script (hack/build-kube.sh) reads the same file.
var KubeVersion = strings.TrimSpace(kubeVersionFile)

// CacheDir is where binaries built for tests live, outside the git tree:
// $FLOTILLA_CACHE, or $XDG_CACHE_HOME/flotilla, or ~/.cache/flotilla.
func CacheDir() string {
	if d := os.Getenv("FLOTILLA_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "flotilla")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "flotilla")
}

// KubeBinDir holds kube-apiserver, kube-controller-manager, kube-scheduler
// and kubectl of KubeVersion.
func KubeBinDir() string { return filepath.Join(CacheDir(), "kube", KubeVersion, "bin") }
