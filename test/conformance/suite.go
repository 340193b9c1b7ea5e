package conformance

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// SuiteModule is the suite's Go module; MCSAPIVersion is the API module it
// is built against outside upstream's repository (whose go.mod points the
// suite at the repository's root instead).
const (
	SuiteModule   = "sigs.k8s.io/mcs-api/conformance"
	MCSAPIVersion = "sigs.k8s.io/mcs-api@v0.5.2"
)

// SharedModules are the modules the suite is built with at the project's
// own versions (ProjectVersions) rather than its go.mod's: the build then
// reuses the packages the project's own build compiled instead of
// compiling a second Kubernetes client, minutes on a fresh machine.
var SharedModules = []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go"}

// ProjectVersions gives each of SharedModules as path@version, the
// version the project's module in root requires.
func ProjectVersions(root string) ([]string, error) {
	cmd := exec.Command("go", append([]string{"list", "-m", "-f", "{{.Path}}@{{.Version}}"}, SharedModules...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m %s in %s: %w", strings.Join(SharedModules, " "), root, err)
	}
	return strings.Fields(string(out)), nil
}

// BuildSuite builds the suite in src (a copy of upstream's conformance
// directory) with `go test -c` from a copy under cache, with the module
// versions require gives (path@version) on top of its go.mod's, and
// returns the test binary's path. The copy and the binary are named
// after the source's content and those versions: an unchanged source is
// built once. src itself is only read; the suite's code is built as it
// is.
func BuildSuite(src, cache string, require ...string) (string, error) {
	sum, err := treeSum(src)
	if err != nil {
		return "", fmt.Errorf("read the suite's source %s (MCS_CONFORMANCE): %w", src, err)
	}
	if err := checkSuite(src); err != nil {
		return "", err
	}
	if len(require) > 0 {
		h := sha256.Sum256([]byte(sum + "\x00" + strings.Join(require, "\x00")))
		sum = hex.EncodeToString(h[:8])
	}
	dir := filepath.Join(cache, "mcs-conformance", sum)
	bin := filepath.Join(dir, "conformance.test")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	work := filepath.Join(dir, "src")
	if err := os.RemoveAll(work); err != nil {
		return "", err
	}
	if err := copyTree(src, work); err != nil {
		return "", fmt.Errorf("copy the suite's source: %w", err)
	}
	edit := []string{"go", "mod", "edit", "-dropreplace", "sigs.k8s.io/mcs-api", "-require", MCSAPIVersion}
	for _, r := range require {
		edit = append(edit, "-require", r)
	}
	steps := [][]string{
		edit,
		{"go", "mod", "tidy"},
		{"go", "test", "-c", "-o", bin + ".tmp", "."},
	}
	for _, s := range steps {
		cmd := exec.Command(s[0], s[1:]...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build the suite: %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	return bin, os.Rename(bin+".tmp", bin)
}

// checkSuite says what is wrong when src is not the suite's directory.
func checkSuite(src string) error {
	mod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return fmt.Errorf("%s (MCS_CONFORMANCE) is not the suite's directory: %w; want the conformance/ directory of kubernetes-sigs/mcs-api", src, err)
	}
	first, _, _ := strings.Cut(string(mod), "\n")
	if strings.TrimSpace(first) != "module "+SuiteModule {
		return fmt.Errorf("%s/go.mod starts %q, want \"module %s\": MCS_CONFORMANCE names the conformance/ directory of kubernetes-sigs/mcs-api", src, first, SuiteModule)
	}
	return nil
}

// treeSum is a digest of every regular file's path and content under
// root.
func treeSum(root string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		fmt.Fprintf(h, "%s\x00", rel)
		_, err = io.Copy(h, f)
		return err
	})
	return hex.EncodeToString(h.Sum(nil)[:8]), err
}

// copyTree copies the directories and regular files under src to dst,
// writable whatever their modes were (a read-only checkout's copy is
// edited by go mod).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		}
		return nil
	})
}
