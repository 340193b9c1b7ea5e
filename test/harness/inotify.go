package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// inotifyLimit caps the inotify instances of each user, host-wide: every
// process of every test that runs as root draws on it. A real node takes
// about eight (kubelet six: cAdvisor, its certificate and plugin
// watchers; containerd and kube-proxy one each), a control plane nine.
// Debian's 128 ran out when two clusters of three nodes started next to
// other tests, and kubelet exited: "Failed to start cAdvisor"
// err="inotify_init: too many open files".
const inotifyLimit = "fs.inotify.max_user_instances"

// inotifyHeadroom is how many instances the limit leaves free, above
// those in use, once raised: enough for dozens of nodes starting at once.
const inotifyHeadroom = 512

// ensureInotifyRoom raises the host's inotify instance limit to leave
// inotifyHeadroom instances free when fewer than half that are, recording
// its value first: it is restored with the sysctls kubelet changes, when
// the last run with nodes ends.
func (e *Env) ensureInotifyRoom() error {
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
		if limit-inUse >= inotifyHeadroom/2 {
			return nil
		}
		want := inUse + inotifyHeadroom
		if err := recordOriginal(inotifyLimit); err != nil {
			return err
		}
		if err := writeSysctl(inotifyLimit, strconv.Itoa(want)); err != nil {
			return fmt.Errorf("raise %s from %d to %d (%d in use), which kubelets need: %w", inotifyLimit, limit, want, inUse, err)
		}
		e.t.Logf("harness: raised %s from %d to %d (%d in use) for real nodes; restored when the last run with nodes ends", inotifyLimit, limit, want, inUse)
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
		if target, err := os.Readlink(fd); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
