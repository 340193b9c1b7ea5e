package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var flotillaBuild struct {
	once sync.Once
	path string
	err  error
}

// Flotilla builds the flotilla binary from this checkout once per test
// binary, as `make build` does (paths trimmed, no symbol table or DWARF:
// what users run, and what start-up is measured with), and returns its
// path. It lives in the cache, outside the git tree, and is replaced
// atomically, so parallel test packages do not trip over each other.
func Flotilla(t TB) string {
	t.Helper()
	b := &flotillaBuild
	b.once.Do(func() {
		dir := filepath.Join(CacheDir(), "bin")
		if b.err = os.MkdirAll(dir, 0o755); b.err != nil {
			return
		}
		// Named after this process too, as Sweep reads the pid at the
		// end of the name: another package's sweep keeps the binary
		// while it is being built.
		tmp, err := os.CreateTemp(dir, fmt.Sprintf("flotilla-*-%d.tmp", os.Getpid()))
		if err != nil {
			b.err = err
			return
		}
		tmp.Close()
		if b.err = buildFlotilla(tmp.Name(), nil, releaseFlags...); b.err != nil {
			os.Remove(tmp.Name())
			return
		}
		b.path = filepath.Join(dir, fmt.Sprintf("flotilla-%d", os.Getpid()))
		b.err = os.Rename(tmp.Name(), b.path)
	})
	if b.err != nil {
		t.Fatalf("harness: %v", b.err)
	}
	return b.path
}

// releaseFlags build the binary as users get it (`make build`, `make
// image`): paths trimmed, no symbol table or DWARF.
var releaseFlags = []string{"-trimpath", "-ldflags", "-s -w"}

// buildFlotilla builds cmd/flotilla of this checkout to path with go
// build's flags and env added to the environment.
func buildFlotilla(path string, env []string, flags ...string) error {
	args := append(append([]string{"build"}, flags...), "-o", path, "github.com/flotilla-io/flotilla/cmd/flotilla")
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build flotilla: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
