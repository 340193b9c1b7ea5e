package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// inotifyLimit caps the inotify instances of each user, host-wide: every
// process of every test that runs as root draws on it. Debian's 128 ran
// out when two clusters of three nodes started next to other tests, and
// kubelet exited: "Failed to start cAdvisor" err="inotify_init: too many
// open files"; and 21 control planes with their agents need about 210.
const inotifyLimit = "fs.inotify.max_user_instances"

// controlPlaneInotify is what one control plane takes, counted in
// /proc/PID/fd (anon_inode:inotify): kube-apiserver three, the controller
// manager six, the scheduler and etcd none (TestControlPlaneInotify
// checks it). A real node takes about eight (kubelet six: cAdvisor, its
// certificate and plugin watchers; containerd and kube-proxy one each),
// sized by inotifyHeadroom as nodes start one by one.
const controlPlaneInotify = 9

// inotifyHeadroom is how many instances the limit leaves free, above
// those in use, when the harness raises it for real nodes: enough for
// dozens of nodes starting at once. Half of it is left beyond any
// other need, for what starts meanwhile.
const inotifyHeadroom = 512

// inotifyRaise says what to raise the limit to so that need instances
// are free beside inUse, with half of inotifyHeadroom to spare; raise is
// false when limit already leaves need free.
func inotifyRaise(limit, inUse, need int) (to int, raise bool) {
	if limit-inUse >= need {
		return limit, false
	}
	return inUse + need + inotifyHeadroom/2, true
}

// EnsureInotify makes room in the host's inotify instance limit for
// instances more, taken by what the caller is about to start (forWhat
// says what, for the log): processes the harness cannot size itself,
// such as agents. Control planes and nodes make their own room.
func (e *Env) EnsureInotify(instances int, forWhat string) {
	e.t.Helper()
	if err := e.ensureInotifyRoom(instances, forWhat); err != nil {
		e.fatalf("%v", err)
	}
}

// ensureInotifyRoom raises the host's inotify instance limit when fewer
// than need instances are free, recording its value first: it is
// restored with the sysctls kubelet changes, when the last run with nodes
// or control planes ends. The run claims that host state even when it
// raises nothing, so that no other run restores the limit beneath it.
func (e *Env) ensureInotifyRoom(need int, forWhat string) error {
	if err := e.claimSysctls(); err != nil {
		return err
	}
	return withSysctlLock(func() error {
		v, err := readSysctl(inotifyLimit)
		if err != nil {
			return fmt.Errorf("read %s: %w", inotifyLimit, err)
		}
		limit, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("read %s: %q is not a number", inotifyLimit, v)
		}
		inUse := inotifyInstances()
		want, raise := inotifyRaise(limit, inUse, need)
		if !raise {
			return nil
		}
		if err := recordOriginal(inotifyLimit); err != nil {
			return err
		}
		if err := writeSysctl(inotifyLimit, strconv.Itoa(want)); err != nil {
			return fmt.Errorf("raise %s from %d to %d (%d in use, %d needed for %s): %w", inotifyLimit, limit, want, inUse, need, forWhat, err)
		}
		e.t.Logf("harness: raised %s from %d to %d (%d in use, %d needed for %s); restored when the last run with nodes or control planes ends", inotifyLimit, limit, want, inUse, need, forWhat)
		return nil
	})
}

// inotifyInstances counts the inotify instances open on the host: an
// upper bound of root's, as an instance shared by several processes
// counts once in each.
func inotifyInstances() int {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	n := 0
	for _, fd := range fds {
		if isInotify(fd) {
			n++
		}
	}
	return n
}

// processInotify counts the inotify instances process pid holds.
func processInotify(pid int) int {
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	n := 0
	for _, fd := range fds {
		if isInotify(fd) {
			n++
		}
	}
	return n
}

func isInotify(fd string) bool {
	target, err := os.Readlink(fd)
	return err == nil && target == "anon_inode:inotify"
}
