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

// Control planes start when the host's inotify instances are nearly used
// up, with every watch they make and room left for what the test starts
// next: kube-apiserver takes three and the controller manager six, and
// 21 clusters (the namespace offloading benchmark at 20 providers) did not
// fit in Debian's 128. Without room the control planes still serve, but
// log "error creating fsnotify watcher: too many open files" (their
// certificate files unwatched), and the agents started next exit. The
// harness makes room for them as for nodes, and the limit is restored when
// the run ends.
func TestControlPlanesStartWhenInotifyIsScarce(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.HoldNodesAlone(t)
	lowerInotifyLimit(t, 5000)
	var run string
	t.Run("control planes", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		useUpInotify(t, 2)
		cps := env.ControlPlanes(2, harness.ControlPlaneOptions{})
		for _, cp := range cps {
			assertDeploymentGetsReplicaSet(t, cp)
			for _, p := range []*harness.Process{cp.APIServer, cp.ControllerManager} {
				if exited, err := p.Exited(); exited {
					t.Fatalf("%s exited: %v\n%s", p.Name, err, p.Tail(10))
				}
				b, err := os.ReadFile(p.LogPath)
				if err != nil {
					t.Fatal(err)
				}
				for l := range strings.Lines(string(b)) {
					if strings.Contains(l, "too many open files") {
						t.Errorf("%s: %s", p.Name, strings.TrimSpace(l))
					}
				}
			}
		}
		// What an agent started next takes.
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			t.Fatalf("no inotify instance left once the control planes run: %v", err)
		}
		unix.Close(fd)
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
