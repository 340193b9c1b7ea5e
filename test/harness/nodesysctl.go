package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// kubeletSysctls are the host-wide sysctls kubelet sets when it starts
// (vm.overcommit_memory 1, kernel.panic 10, kernel.panic_on_oops 1). A
// network namespace does not separate them.
var kubeletSysctls = []string{"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops"}

// The values before the first kubelet of any run (and the inotify limit's
// before the harness raises it) are kept in a host-wide file; each run
// with nodes or control planes holds a marker file; the last run to
// finish (or Sweep, after a crash) restores the values and removes the
// file.
var (
	sysctlOriginals = filepath.Join(lockDir, "sysctl-originals")
	sysctlLock      = filepath.Join(lockDir, "sysctl.lock")
)

func nodesMarker(run string) string { return filepath.Join(lockDir, run+".nodes") }

// nodesLock is held shared by every run while it has real nodes or
// control planes (both draw on the inotify limit), and exclusively by a
// test that must be the only one changing host-wide state
// (HoldNodesAlone); packages of one `go test ./...` run at once.
var nodesLock = filepath.Join(lockDir, "nodes.lock")

// nodesAloneEnv tells a child test binary that its parent holds the nodes
// lock exclusively for it: the child's runs take no lock of their own.
const nodesAloneEnv = "FLOTILLA_TEST_NODES_ALONE"

// lockNodes takes the nodes lock, shared or exclusive, waiting for it;
// the lock is released when t ends.
func lockNodes(t TB, how int) error {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(nodesLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return fmt.Errorf("lock %s: %w", nodesLock, err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
	return nil
}

// HoldNodesAlone waits until no other run has real nodes or control
// planes and keeps others from starting any until t ends, for a test that
// checks host-wide state kubelets change (sysctls, the inotify limit).
// Child test binaries it starts inherit the hold. Call it from a test
// that is not parallel, and name the test in the Makefile's HOLD_TESTS:
// `make test` runs those first, by themselves. Among other packages one
// of whose tests always holds the lock shared, flock lets an exclusive
// holder wait until they all end.
func HoldNodesAlone(t testing.TB) {
	t.Helper()
	start := time.Now()
	if err := lockNodes(t, unix.LOCK_EX); err != nil {
		t.Fatalf("harness: hold real nodes alone: %v", err)
	}
	// The wait is not the test's: a slow test and a long queue read apart.
	if waited := time.Since(start); waited > time.Second {
		t.Logf("harness: waited %s for other runs' nodes and control planes to end", waited.Round(time.Second))
	}
	t.Setenv(nodesAloneEnv, "1")
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
	return strings.TrimSpace(string(b)), err
}

func writeSysctl(key, value string) error {
	return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
}

// withSysctlLock runs fn holding the host-wide lock on the originals file.
func withSysctlLock(fn func() error) error { return withHostLock(sysctlLock, fn) }

// withHostLock runs fn holding the host-wide lock file path (exclusive,
// across test processes), made in lockDir if need be.
func withHostLock(path string, fn func() error) error {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return fn()
}

// claimSysctls records, once per run, that the run is about to start
// kubelets or control planes, and the values of the sysctls kubelets
// change unless another run already did.
func (e *Env) claimSysctls() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sysctlsClaimed {
		return nil
	}
	// Cleanups run last-in first-out: the shared lock is released after
	// the sysctls, below.
	if os.Getenv(nodesAloneEnv) == "" {
		if err := lockNodes(e.t, unix.LOCK_SH); err != nil {
			return err
		}
	}
	err := withSysctlLock(func() error {
		if err := os.WriteFile(nodesMarker(e.RunID), nil, 0o644); err != nil {
			return err
		}
		for _, k := range kubeletSysctls {
			if err := recordOriginal(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record the sysctls kubelet changes: %w", err)
	}
	e.sysctlsClaimed = true
	e.t.Cleanup(func() {
		if err := releaseSysctls(e.RunID); err != nil {
			e.t.Logf("harness: %v", err)
		}
	})
	return nil
}

// recordOriginal adds key's value to the originals file, unless a run
// already recorded it (another run with nodes or control planes is live,
// or a dead one's sweep is due). The caller holds the sysctl lock.
func recordOriginal(key string) error {
	b, err := os.ReadFile(sysctlOriginals)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, _, _ := strings.Cut(line, "="); k == key {
			return nil
		}
	}
	v, err := readSysctl(key)
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	f, err := os.OpenFile(sysctlOriginals, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%s=%s\n", key, v); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// kubeletSocket is the device-plugin socket every kubelet creates there,
// whatever its --root-dir; the last one started owns it.
const kubeletSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// releaseSysctls removes run's marker (none for ""); when no live run
// with nodes or control planes is left, it restores the recorded sysctls
// and removes the kubelets' stale device-plugin socket.
func releaseSysctls(run string) error {
	return withSysctlLock(func() error {
		if run != "" {
			os.Remove(nodesMarker(run))
		}
		markers, _ := filepath.Glob(filepath.Join(lockDir, "*.nodes"))
		for _, m := range markers {
			r := strings.TrimSuffix(filepath.Base(m), ".nodes")
			if !runIsDead(r) {
				return nil // its kubelets may still run
			}
			os.Remove(m)
		}
		if _, err := os.Stat(kubeletSocket); err == nil && !listening(kubeletSocket) {
			os.Remove(kubeletSocket)
		}
		b, err := os.ReadFile(sysctlOriginals)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var errs []error
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			if err := writeSysctl(k, v); err != nil {
				errs = append(errs, fmt.Errorf("restore %s to %s: %w", k, v, err))
			}
		}
		if len(errs) == 0 {
			os.Remove(sysctlOriginals)
		}
		return errors.Join(errs...)
	})
}

// hostStateLeft lists host-wide state of kubelets that no live run with
// nodes explains: sysctls that differ from the recorded values, the
// record itself, a stale device-plugin socket.
func hostStateLeft() []string {
	markers, _ := filepath.Glob(filepath.Join(lockDir, "*.nodes"))
	for _, m := range markers {
		if !runIsDead(strings.TrimSuffix(filepath.Base(m), ".nodes")) {
			return nil
		}
	}
	var out []string
	if _, err := os.Stat(kubeletSocket); err == nil && !listening(kubeletSocket) {
		out = append(out, "socket "+kubeletSocket)
	}
	b, err := os.ReadFile(sysctlOriginals)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, want, _ := strings.Cut(line, "=")
		if got, err := readSysctl(k); err == nil && got != want {
			out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", k, got, want))
		}
	}
	return append(out, "file "+sysctlOriginals)
}
