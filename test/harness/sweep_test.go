package harness

import (
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
