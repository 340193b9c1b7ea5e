package harness

import (
	"net/netip"
	"testing"
)

// The limit is raised only when what is about to start does not fit, and
// then to fit it with room to spare: 21 control planes (the namespace
// offloading benchmark at 20 providers) on Debian's 128.
func TestInotifyRaise(t *testing.T) {
	for _, tc := range []struct {
		name               string
		limit, inUse, need int
		want               int
		raise              bool
	}{
		{"fits", 128, 20, 9, 128, false},
		{"fits exactly", 128, 119, 9, 128, false},
		{"one short", 128, 120, 9, 120 + 9 + inotifyHeadroom/2, true},
		{"21 control planes on Debian's 128", 128, 10, 21 * controlPlaneInotify, 10 + 21*controlPlaneInotify + inotifyHeadroom/2, true},
		{"21 control planes on a raised limit", 8192, 10, 21 * controlPlaneInotify, 8192, false},
		{"nodes keep their headroom", 128, 40, inotifyHeadroom / 2, 40 + inotifyHeadroom, true},
		{"over the limit already", 128, 130, 9, 130 + 9 + inotifyHeadroom/2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, raise := inotifyRaise(tc.limit, tc.inUse, tc.need)
			if got != tc.want || raise != tc.raise {
				t.Errorf("inotifyRaise(%d, %d, %d) = %d, %v; want %d, %v", tc.limit, tc.inUse, tc.need, got, raise, tc.want, tc.raise)
			}
		})
	}
}

// A control plane, scheduler and node CIDRs included, takes no more
// inotify instances than controlPlaneInotify, the room the harness makes
// for each.
func TestControlPlaneInotify(t *testing.T) {
	LongRunning(t)
	Require(t, NeedsControlPlane...)
	env := New(t)
	cp := env.ControlPlane("cp", ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
	// Counted once the controller manager runs every controller
	// (waitControllers).
	total := 0
	for _, p := range []*Process{cp.Etcd, cp.APIServer, cp.ControllerManager, cp.Scheduler} {
		n := processInotify(p.Cmd.Process.Pid)
		t.Logf("%s: %d inotify instances", p.Name, n)
		total += n
	}
	if total > controlPlaneInotify {
		t.Errorf("a control plane takes %d inotify instances, the harness makes room for %d (controlPlaneInotify)", total, controlPlaneInotify)
	}
	if total == 0 {
		t.Errorf("a control plane takes no inotify instances: the count does not see them (anon_inode:inotify in /proc/PID/fd)")
	}
}
