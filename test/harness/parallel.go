package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ParallelEnvVar set to "0" makes LongRunning tests run one after
// another, to tell a failure of load from one of the test.
const ParallelEnvVar = "FLOTILLA_E2E_PARALLEL"

// SlotsEnvVar sets how many LongRunning tests run at once on the host,
// across every test binary (default 2).
const SlotsEnvVar = "FLOTILLA_TEST_SLOTS"

const defaultSlots = 2

// LongRunning marks a test that brings up real parts (control planes,
// nodes, network namespaces) and takes seconds to minutes: such tests run
// beside each other once every other test of the package has ended, but
// no more of them at once on the host than FLOTILLA_TEST_SLOTS (two),
// whichever package they are in: `go test ./...` runs packages side by
// side, and two packages each running two clusters of real nodes on two
// cores starve every one of them (kubectl and the agents' API calls time
// out). Each run has its own namespaces, links, names, ports and files,
// so they do not meet. A test that checks or changes host-wide state
// (HoldNodesAlone, a sweep, a fake dead run) must not call it: it runs
// before them, alone in its package.
func LongRunning(t *testing.T) {
	t.Helper()
	if os.Getenv(ParallelEnvVar) != "0" {
		t.Parallel()
	}
	n := defaultSlots
	if v := os.Getenv(SlotsEnvVar); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("harness: %s=%q: want a number of at least 1", SlotsEnvVar, v)
		}
	}
	start := time.Now()
	release, err := takeSlot(lockDir, n)
	if err != nil {
		t.Fatalf("harness: take a slot for a long-running test: %v", err)
	}
	// Registered first, so released last: after the test's own
	// cleanups have stopped what it brought up.
	t.Cleanup(release)
	if waited := time.Since(start); waited > time.Second {
		t.Logf("harness: waited %s for a slot among %d (other long-running tests of this host)", waited.Round(time.Second), n)
	}
}

// takeSlot holds one of n host-wide slot files (dir/slot-<i>.lock)
// exclusively, waiting until one is free; release gives it back. A
// process that dies releases its slots with its file descriptors.
func takeSlot(dir string, n int) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for {
		for i := range n {
			path := filepath.Join(dir, fmt.Sprintf("slot-%d.lock", i))
			f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				return nil, err
			}
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				return func() { f.Close() }, nil
			}
			f.Close()
			if err != unix.EWOULDBLOCK {
				return nil, fmt.Errorf("lock %s: %w", path, err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}
