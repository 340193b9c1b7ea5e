package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// Sweep removes WireGuard control sockets of dead runs that nobody serves,
// and keeps one a process still listens on.
func TestSweepRemovesOrphanWireGuardSockets(t *testing.T) {
	Require(t, Root)
	if err := os.MkdirAll("/var/run/wireguard", 0o755); err != nil {
		t.Fatal(err)
	}
	dead := "000000" // no lock file: a dead run
	orphan := filepath.Join("/var/run/wireguard", linkPrefix+dead+"x.sock")
	served := filepath.Join("/var/run/wireguard", linkPrefix+dead+"y.sock")
	l, err := net.Listen("unix", orphan)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the file stays, as after a SIGKILL
	live, err := net.Listen("unix", served)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	t.Cleanup(func() { os.Remove(orphan); os.Remove(served) })

	if err := Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphan socket of a dead run survived the sweep: %v", err)
	}
	if _, err := os.Stat(served); err != nil {
		t.Errorf("a served socket was removed: %v", err)
	}
}

// Sweep keeps the binaries and temporary builds of live test processes
// and removes those of dead ones: packages run in parallel, and one's
// sweep must not take the binary another is still building.
func TestSweepKeepsBinariesOfLiveProcesses(t *testing.T) {
	Require(t, Root)
	dir := filepath.Join(CacheDir(), "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	building, err := os.CreateTemp(dir, fmt.Sprintf("flotilla-*-%d.tmp", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	building.Close()
	deadPid := 1 << 30 // above pid_max's limit: no such process
	dead := filepath.Join(dir, fmt.Sprintf("flotilla-%d", deadPid))
	if err := os.WriteFile(dead, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(building.Name()); os.Remove(dead) })

	if err := Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(building.Name()); err != nil {
		t.Errorf("the sweep removed a build of this live process: %v", err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("a dead process's binary survived the sweep: %v", err)
	}
}
