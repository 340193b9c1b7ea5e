package harness

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// What a real node leaves outside its network namespace and its processes,
// and how the harness finds it again, also after a crash: every piece is
// named after the run or lies inside the run directory.
//
//   - cgroups: "flotest-<run>-<cp>-<node>" at the top of every hierarchy
//     (the node's kubelet cgroupRoot); container processes live there;
//   - mounts under the run directory (kubelet's root, pod volumes,
//     container root filesystems, pod network namespaces);
//   - links in /var/log/containers that point into the run directory;
//   - CNI's cache files /var/lib/cni/results/flotest-<run>-*, and the
//     shim sockets and loopback cache files of its containerds' tasks
//     (runtimeFiles);
//   - the host-wide sysctls kubelet sets at start (restored once no run
//     with nodes is left).

// cgroupHierarchies returns the mount points of every cgroup hierarchy (v1
// controllers, named v1 hierarchies and the v2 unified one).
func cgroupHierarchies() []string {
	var out []string
	for _, m := range readMountinfo() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// createCgroup creates cgroup name at the top of every hierarchy, with the
// parent's CPUs and memory nodes in cpuset (a new cpuset has none).
func createCgroup(name string) error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// cgroupProcesses lists the processes in cgroup name and below, in any
// hierarchy.
func cgroupProcesses(name string) []int { return cgroupProcessesBut(name, nil) }

// cgroupProcessesBut is cgroupProcesses without the processes in cgroup
// directories whose names are in skip (a pod's: "pod<uid>", kubelet's
// cgroupfs layout).
func cgroupProcessesBut(name string, skip map[string]bool) []int {
	seen := map[int]bool{}
	for _, h := range cgroupHierarchies() {
		filepath.WalkDir(filepath.Join(h, name), func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if skip[d.Name()] {
				return filepath.SkipDir
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// killCgroup kills every process in cgroup name and waits (up to 5 s) until
// none is left.
func killCgroup(name string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := cgroupProcesses(name)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v survive SIGKILL", name, pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeCgroup kills what runs in cgroup name and removes it, children
// first, from every hierarchy.
func removeCgroup(name string) error {
	errs := []error{killCgroup(name)}
	for _, h := range cgroupHierarchies() {
		top := filepath.Join(h, name)
		var dirs []string
		filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- { // children before parents
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// harnessCgroups lists the harness's top-level cgroups, by name, in any
// hierarchy.
func harnessCgroups() []string {
	seen := map[string]bool{}
	for _, h := range cgroupHierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), Prefix) {
				seen[e.Name()] = true
			}
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

type mountEntry struct{ point, fstype string }

func readMountinfo() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mountEntry{point: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	dir = filepath.Clean(dir)
	var out []string
	for _, m := range readMountinfo() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(out)
}

// unmountUnder detaches every mount at or below dir. Kubelet's root is an
// rshared bind mount of itself, so a mount point can be stacked several
// times: it repeats until none is left.
func unmountUnder(dir string) error {
	for range 20 {
		points := mountsUnder(dir)
		if len(points) == 0 {
			return nil
		}
		for _, p := range points {
			unix.Unmount(p, unix.MNT_DETACH)
		}
	}
	if left := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("mounts under %s survive unmounting: %v", dir, left)
	}
	return nil
}

// removeRunDir unmounts what is mounted in a run directory and removes it.
// It refuses to remove a directory that still has a mount in it: removing
// files through a mount could reach far outside the run.
func removeRunDir(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return fmt.Errorf("not removing %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

// containerLogDir is where every kubelet links its containers' logs,
// whatever its root directory.
const containerLogDir = "/var/log/containers"

// containerLogLinks lists the links in /var/log/containers that point into
// a directory of run (any run when run is "", by the harness's prefix).
func containerLogLinks(run string) []string {
	entries, _ := os.ReadDir(containerLogDir)
	var out []string
	for _, e := range entries {
		link := filepath.Join(containerLogDir, e.Name())
		target, err := os.Readlink(link)
		if err != nil {
			continue
		}
		if r := runOf(firstTempComponent(target)); r != "" && (run == "" || r == run) {
			out = append(out, link)
		}
	}
	return out
}

// cniCacheFiles lists CNI's cached results of run's networks (any run's
// when run is "").
func cniCacheFiles(run string) []string {
	pattern := Prefix + run + "-*"
	if run == "" {
		pattern = Prefix + "*"
	}
	files, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", pattern))
	return files
}

// runContainerds lists the containerd directories of a run directory's
// nodes.
func runContainerds(runDir string) []string {
	ctrds, _ := filepath.Glob(filepath.Join(runDir, "*", "nodes", "*", "containerd"))
	return ctrds
}

// removeRuntimeFiles removes runtimeFiles, but no socket a live shim
// serves.
func removeRuntimeFiles(ctrds ...string) {
	for _, f := range runtimeFiles(ctrds...) {
		if !listening(f) {
			os.Remove(f)
		}
	}
}

// runtimeFiles lists the host-wide files the containerds (directories) of
// real nodes keep for their sandboxes and containers: shim sockets in
// /run/containerd/s (named by a hash of containerd's address, namespace
// and task ID) and CNI's cached loopback results. A crash leaves them; the
// IDs are found in the containerds' own directories, so only ours go.
func runtimeFiles(ctrds ...string) []string {
	var out []string
	for _, c := range ctrds {
		ids := map[string]bool{}
		for _, pattern := range []string{
			filepath.Join(c, "state", "io.containerd.runtime.v2.task", "k8s.io", "*"),
			filepath.Join(c, "root", "io.containerd.grpc.v1.cri", "sandboxes", "*"),
			filepath.Join(c, "root", "io.containerd.grpc.v1.cri", "containers", "*"),
		} {
			matches, _ := filepath.Glob(pattern)
			for _, m := range matches {
				ids[filepath.Base(m)] = true
			}
		}
		sock := filepath.Join(c, "containerd.sock")
		for id := range ids {
			sum := sha256.Sum256([]byte(filepath.Join(sock, "k8s.io", id)))
			for _, f := range []string{
				filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:])),
				filepath.Join("/var/lib/cni/results", "cni-loopback-"+id+"-lo"),
			} {
				if _, err := os.Lstat(f); err == nil {
					out = append(out, f)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
