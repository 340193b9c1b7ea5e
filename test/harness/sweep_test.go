package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Sweep removes WireGuard control sockets of dead runs that nobody serves,
// in /run/wireguard and in a replica's directory (WireGuardSocketDir),
// and that directory once empty; it keeps a socket a process still
// listens on, and the directory that holds one.
func TestSweepRemovesOrphanWireGuardSockets(t *testing.T) {
	Require(t, Root)
	dead := "000000" // no lock file: a dead run
	link := linkPrefix + dead + "x"
	orphanDir := filepath.Join(wireguardDir, WireGuardSocketDir(link, "gw"))
	servedDir := filepath.Join(wireguardDir, WireGuardSocketDir(link, "gw2"))
	for _, dir := range []string{orphanDir, servedDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	orphan := filepath.Join(wireguardDir, link+".sock")
	orphanIn := filepath.Join(orphanDir, link+".sock")
	served := filepath.Join(wireguardDir, linkPrefix+dead+"y.sock")
	servedIn := filepath.Join(servedDir, link+".sock")
	t.Cleanup(func() {
		for _, p := range []string{orphan, orphanIn, served, servedIn, orphanDir, servedDir} {
			os.Remove(p)
		}
	})
	for _, p := range []string{orphan, orphanIn} {
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close() // the file stays, as after a SIGKILL
	}
	for _, p := range []string{served, servedIn} {
		live, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		defer live.Close()
	}
	left := fmt.Sprint(Leftovers(dead))
	for _, p := range []string{orphan, orphanIn, served, servedIn, orphanDir, servedDir} {
		if !strings.Contains(left, p) {
			t.Errorf("Leftovers(%s) does not name %s: %s", dead, p, left)
		}
	}

	if err := Sweep(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{orphan, orphanIn, orphanDir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s of a dead run survived the sweep: %v", p, err)
		}
	}
	if _, err := os.Stat(servedIn); err != nil {
		t.Errorf("a served socket in a replica's directory was removed: %v", err)
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
