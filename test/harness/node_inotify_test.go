package harness_test

import (
	"errors"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flotilla-io/flotilla/test/harness"
)

// A node starts when the host's inotify instances, a per-user limit every
// process on the host draws on, are nearly used up: the harness makes
// room, where kubelet used to exit with "Failed to start cAdvisor"
// err="inotify_init: too many open files" (two clusters of three nodes,
// next to other tests). The limit is restored when the run ends.
func TestNodeStartsWhenInotifyIsScarce(t *testing.T) {
	harness.Require(t, harness.NeedsNodes...)
	// The limit is host-wide: no other run's nodes start while this test
	// uses it up, and none is live to keep it raised afterwards.
	harness.HoldNodesAlone(t)
	// A host that allows thousands would never run short: bring it within
	// reach here (restored after the run's own restoring, on this t).
	lowerInotifyLimit(t, 5000)
	var run string
	t.Run("node", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
		useUpInotify(t, 2)
		n := cp.StartNode("n1", harness.NodeOptions{}) // returns once Ready
		if exited, err := n.Kubelet.Exited(); exited {
			t.Fatalf("node %s Ready, but its kubelet exited (%v)", n.NodeName, err)
		}
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

// useUpInotify opens inotify instances until the user's limit refuses
// more, closes free of them again, and the rest when the test ends.
func useUpInotify(t *testing.T, free int) {
	t.Helper()
	var fds []int
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	const most = 10000 // well below the descriptors a test binary may open
	for len(fds) < most {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if errors.Is(err, unix.EMFILE) {
			break
		}
		if err != nil {
			t.Fatalf("inotify_init1: %v", err)
		}
		fds = append(fds, fd)
	}
	if len(fds) == most {
		t.Fatalf("%d inotify instances opened and the limit still not reached", most)
	}
	if len(fds) < free {
		t.Fatalf("only %d inotify instances were free; want at least %d to leave", len(fds), free)
	}
	for _, fd := range fds[len(fds)-free:] {
		unix.Close(fd)
	}
	fds = fds[:len(fds)-free]
	t.Logf("holding %d inotify instances, %d left free", len(fds), free)
}

// lowerInotifyLimit brings a host limit of inotify instances above most
// down to most, so that this test can use them up, and puts the value
// back when the test ends (after the harness restored what it recorded).
func lowerInotifyLimit(t *testing.T, most int) {
	t.Helper()
	const path = "/proc/sys/fs/inotify/max_user_instances"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(b))
	limit, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %q", path, v)
	}
	if limit <= most {
		return
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(most)), 0o644); err != nil {
		t.Fatalf("lower %s from %d to %d: %v", path, limit, most, err)
	}
	t.Logf("lowered %s from %d to %d for this test", path, limit, most)
	t.Cleanup(func() {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			t.Errorf("restore %s to %s: %v", path, v, err)
		}
	})
}
