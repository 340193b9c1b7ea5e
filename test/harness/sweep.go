package harness

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Sweep removes what runs that no longer hold their lock left behind:
// their processes (containers of real nodes by their cgroups), network
// namespaces, temporary directories (unmounting what is mounted in them),
// cgroups, container log links, CNI cache files, image tarballs, and lock
// files, and restores the sysctls kubelets changed once no live run with
// nodes is left. Objects of live runs and anything without the harness prefix are
// never touched.
func Sweep() error {
	dead := map[string]bool{}
	isDead := func(run string) bool {
		if d, ok := dead[run]; ok {
			return d
		}
		d := runIsDead(run)
		dead[run] = d
		return d
	}
	var errs []error
	for _, p := range harnessProcesses() {
		if isDead(p.run) {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	// Containers of real nodes carry no marker; their cgroups name the run.
	for _, cg := range harnessCgroups() {
		if run := runOf(cg); run != "" && isDead(run) {
			killCgroup(cg)
		}
	}
	for _, ns := range harnessNetns() {
		if run := runOf(ns); run != "" && isDead(run) {
			if err := deleteNetns(ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), Prefix+"*"))
	for _, d := range dirs {
		if run := runOf(filepath.Base(d)); run != "" && isDead(run) {
			removeRuntimeFiles(runContainerds(d)...)
			if err := removeRunDir(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, cg := range harnessCgroups() {
		if run := runOf(cg); run != "" && isDead(run) {
			if err := removeCgroup(cg); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, link := range containerLogLinks("") {
		if target, _ := os.Readlink(link); isDead(runOf(firstTempComponent(target))) {
			os.Remove(link)
		}
	}
	for _, f := range cniCacheFiles("") {
		if run := runOf(filepath.Base(f)); run != "" && isDead(run) {
			os.Remove(f)
		}
	}
	// WireGuard control sockets of dead runs, unless someone listens, and
	// their directories.
	for _, sock := range wireguardSockets("") {
		if isDead(linkRun(sock)) && !listening(sock) {
			os.Remove(sock)
		}
	}
	for _, dir := range wireguardSocketDirs("") {
		if isDead(linkRun(dir)) {
			os.Remove(dir) // kept while a live socket is in it
		}
	}
	// Binaries built by Flotilla and the harness's image tarballs are
	// named after the test process.
	bins, _ := filepath.Glob(filepath.Join(CacheDir(), "bin", "flotilla-*"))
	images, _ := filepath.Glob(filepath.Join(CacheDir(), "images", "*-*"))
	for _, b := range append(bins, images...) {
		name := filepath.Base(b)
		tail, _, _ := strings.Cut(name[strings.LastIndex(name, "-")+1:], ".") // "123.tar.tmp"
		pid, err := strconv.Atoi(tail)
		if err != nil || syscall.Kill(pid, 0) != nil {
			os.Remove(b)
		}
	}
	// Restores the sysctls kubelets changed once no live run has nodes.
	if err := releaseSysctls(""); err != nil {
		errs = append(errs, err)
	}
	for run, d := range dead {
		if d {
			os.Remove(filepath.Join(lockDir, run+".lock"))
		}
	}
	// A run killed between taking its lock and renaming it into place
	// leaves an unlocked temporary lock file.
	tmps, _ := filepath.Glob(filepath.Join(lockDir, ".lock-*"))
	for _, f := range tmps {
		if st, err := os.Stat(f); err == nil && time.Since(st.ModTime()) > time.Minute && !isLocked(f) {
			os.Remove(f)
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists what still exists of a run: processes, network
// namespaces, temporary directories, WireGuard sockets, and what real
// nodes leave elsewhere (mounts, cgroups, container log links, CNI cache
// files), plus host-wide kubelet state (sysctls, the device-plugin
// socket) when no live run with nodes explains it. Tests use it to prove
// cleanup.
func Leftovers(run string) []string {
	var out []string
	for _, p := range harnessProcesses() {
		if p.run == run {
			out = append(out, fmt.Sprintf("process %d (%s)", p.pid, p.cmd))
		}
	}
	for _, ns := range harnessNetns() {
		if runOf(ns) == run {
			out = append(out, "netns "+ns)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), Prefix+run+"-*"))
	for _, d := range dirs {
		out = append(out, "directory "+d)
	}
	for _, sock := range wireguardSockets(run) {
		out = append(out, "socket "+sock)
	}
	for _, dir := range wireguardSocketDirs(run) {
		out = append(out, "directory "+dir)
	}
	// What real nodes leave outside processes and namespaces.
	for _, d := range dirs {
		for _, m := range mountsUnder(d) {
			out = append(out, "mount "+m)
		}
		for _, f := range runtimeFiles(runContainerds(d)...) {
			out = append(out, "file "+f)
		}
	}
	for _, cg := range harnessCgroups() {
		if runOf(cg) == run {
			out = append(out, "cgroup "+cg)
		}
	}
	for _, link := range containerLogLinks(run) {
		out = append(out, "link "+link)
	}
	for _, f := range cniCacheFiles(run) {
		out = append(out, "file "+f)
	}
	if _, err := os.Stat(nodesMarker(run)); err == nil {
		out = append(out, "file "+nodesMarker(run))
	}
	return append(out, hostStateLeft()...)
}

// firstTempComponent returns the first path component of path below the
// temporary directory ("" when path is elsewhere).
func firstTempComponent(path string) string {
	rel, err := filepath.Rel(os.TempDir(), path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return ""
	}
	first, _, _ := strings.Cut(rel, "/")
	return first
}

// wireguardDir is where wireguard-go and wg(8) find the control sockets.
const wireguardDir = "/var/run/wireguard"

// WireGuardSocketDir is the directory under /run/wireguard that the
// agent replica on node mounts as its own /run/wireguard, where link
// (named by LinkName) is replicated: the nodes of this machine share
// one /run/wireguard, in which two replicas' sockets of the same name
// would be one. Run cleanup and Sweep remove it with the run's sockets.
func WireGuardSocketDir(link, node string) string { return link + "-" + node }

// wireguardSockets lists userspace WireGuard control sockets of links named
// by LinkName for run, or of any run when run is "", in /run/wireguard
// and in the run's WireGuardSocketDirs.
func wireguardSockets(run string) []string {
	pattern := wireguardPattern(run)
	socks, _ := filepath.Glob(filepath.Join(wireguardDir, pattern+".sock"))
	for _, dir := range wireguardSocketDirs(run) {
		in, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
		socks = append(socks, in...)
	}
	return socks
}

// wireguardSocketDirs lists the WireGuardSocketDirs of run, or of any run
// when run is "".
func wireguardSocketDirs(run string) []string {
	matches, _ := filepath.Glob(filepath.Join(wireguardDir, wireguardPattern(run)+"-*"))
	var dirs []string
	for _, m := range matches {
		if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
			dirs = append(dirs, m)
		}
	}
	return dirs
}

// wireguardPattern matches the link names of run, or of any run when run
// is "".
func wireguardPattern(run string) string {
	if run == "" {
		return linkPrefix + "[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]*"
	}
	return linkPrefix + run + "*"
}

// linkRun is the run of a path that wireguardSockets or
// wireguardSocketDirs found: its name starts with a link's (LinkName).
func linkRun(path string) string {
	return filepath.Base(path)[len(linkPrefix) : len(linkPrefix)+6]
}

// removeWireGuardSockets removes the control sockets of run (by then no
// process of it listens) and its WireGuardSocketDirs.
func removeWireGuardSockets(run string) {
	for _, sock := range wireguardSockets(run) {
		os.Remove(sock)
	}
	for _, dir := range wireguardSocketDirs(run) {
		os.Remove(dir)
	}
}

// listening reports whether a process accepts connections on a socket.
func listening(sock string) bool {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// runOf extracts the run ID from "flotest-<run>-<rest>".
func runOf(name string) string {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return ""
	}
	run, _, ok := strings.Cut(rest, "-")
	if !ok || len(run) != 6 {
		return ""
	}
	return run
}

// runIsDead reports whether no process holds run's lock.
func runIsDead(run string) bool { return !isLocked(filepath.Join(lockDir, run+".lock")) }

// isLocked reports whether some process holds the lock on path.
func isLocked(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false // no lock file at all: nobody can be holding it
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

type harnessProcess struct {
	pid int
	run string
	cmd string
}

// harnessProcesses lists processes whose environment carries a run ID.
func harnessProcesses() []harnessProcess {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	marker := []byte(runEnvVar + "=")
	var out []harnessProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, marker); ok {
				cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
				out = append(out, harnessProcess{pid: pid, run: string(v), cmd: strings.TrimSpace(string(cmd))})
				break
			}
		}
	}
	return out
}

// harnessNetns lists named network namespaces with the harness prefix.
func harnessNetns() []string {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), Prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// deleteNetns kills every process still inside the namespace and removes
// it. Processes are found by comparing namespace inodes, so one started in
// the namespace by anyone (not only the harness) cannot keep it alive.
func deleteNetns(name string) error {
	path := filepath.Join("/run/netns", name)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	killNetnsProcesses(path)
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		return fmt.Errorf("delete netns %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	return nil
}

func killNetnsProcesses(path string) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue
		}
		if st.Ino == want.Ino && st.Dev == want.Dev {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
