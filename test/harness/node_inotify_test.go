package harness_test

import (
	"errors"
	"net/netip"
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
		t.Skipf("the host allows more than %d inotify instances: none is scarce", most)
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
