// Package harness gives tests real parts to run against: Kubernetes control
// planes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler),
// network sites and pods in network namespaces, and a pretend kubelet.
//
// Everything an Env creates carries its run ID in its name (netns
// "flotest-<run>-<name>", temporary directories "flotest-<run>-*") or in its
// environment (processes get FLOTILLA_TEST_RUN=<run>), and is removed when
// the test ends, pass or fail. A run holds a lock file while it is alive;
// New sweeps the leftovers of runs whose lock is no longer held (killed test
// binaries), so a crash never accumulates state.
package harness

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every object the harness creates.
const Prefix = "flotest-"

// runEnvVar marks processes started by the harness with their run ID.
const runEnvVar = "FLOTILLA_TEST_RUN"

// lockDir holds one lock file per live run. It is on tmpfs, so a reboot
// clears it along with every namespace.
const lockDir = "/run/flotilla-test"

// TB is the part of testing.TB the harness needs. *testing.T and *testing.B
// satisfy it; programs such as the demo provide their own.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
	Failed() bool
	Name() string
}

// Env is one run's set of real parts. Create it with New; it is torn down
// by the TB's cleanup.
type Env struct {
	t     TB
	RunID string
	// Dir is a temporary directory for this run (certificates, data,
	// logs), removed at the end.
	Dir string

	lock *os.File

	mu             sync.Mutex
	segments       int  // LANs and routed segments handed out, for subnets
	sysctlsClaimed bool // this run may change host sysctls (kubelets, the inotify limit)
	beforeStop     []func()
	nodes          []*Node // every real node started, for stopNodes
	stopNodesOnce  sync.Once
}

// BeforeNodesStop registers f to run once when the run ends, before its
// first real node stops, even a node started after f was registered
// (cleanups run last first, so such a node's teardown would otherwise
// come first). A check of what the test leaves in its clusters goes
// here: it needs every node still running.
func (e *Env) BeforeNodesStop(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.beforeStop = append(e.beforeStop, f)
}

// nodesStopping runs the BeforeNodesStop functions, each only once.
func (e *Env) nodesStopping() {
	e.mu.Lock()
	fs := e.beforeStop
	e.beforeStop = nil
	e.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// stopNodes stops every real node of the run at once, when the run ends:
// each cluster drained first (once), then every node stopped, in
// parallel rather than one cleanup after another, since most of a node's
// stop is waiting for its processes to exit. A node stopped already (by
// its test) is not stopped again.
func (e *Env) stopNodes() {
	e.stopNodesOnce.Do(func() {
		e.mu.Lock()
		nodes := slices.Clone(e.nodes)
		e.mu.Unlock()
		start := time.Now()
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.cp.drainNodes() // once per cluster; the others wait for it
				if err := n.Stop(); err != nil {
					e.t.Logf("harness: %v", err)
				}
			}()
		}
		wg.Wait()
		e.t.Logf("harness: %d nodes stopped in %s", len(nodes), time.Since(start).Round(time.Millisecond))
	})
}

// New creates an Env bound to t. It first sweeps what killed runs left.
func New(t TB) *Env {
	t.Helper()
	e, err := newEnv(t)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return e
}

func newEnv(t TB) (*Env, error) {
	if os.Geteuid() != 0 {
		t.Helper()
		requireRoot(t)
	}
	if err := Sweep(); err != nil {
		t.Logf("harness: sweeping leftovers of earlier runs: %v", err)
	}
	id, err := newRunID()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", lockDir, err)
	}
	// The lock is taken on a temporary file that is then renamed into
	// place, so a sweeper never sees this run's lock file unlocked.
	tmp, err := os.CreateTemp(lockDir, ".lock-*")
	if err != nil {
		return nil, fmt.Errorf("create run lock: %w", err)
	}
	if err := unix.Flock(int(tmp.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("lock run %s: %w", id, err)
	}
	lockPath := filepath.Join(lockDir, id+".lock")
	if err := os.Rename(tmp.Name(), lockPath); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("lock run %s: %w", id, err)
	}
	lock := tmp
	dir, err := os.MkdirTemp("", Prefix+id+"-")
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	e := &Env{t: t, RunID: id, Dir: dir, lock: lock}
	// Registered first, so it runs last: after every process and namespace
	// of the run is gone.
	t.Cleanup(e.finish)
	return e, nil
}

func (e *Env) finish() {
	if e.t.Failed() {
		e.keepLogs()
	}
	// Every process of the run has stopped: no socket of ours is live.
	removeWireGuardSockets(e.RunID)
	// Real nodes mount inside the run directory; removeRunDir unmounts
	// first and keeps a directory that still has a mount.
	if err := removeRunDir(e.Dir); err != nil {
		e.t.Logf("harness: remove %s: %v", e.Dir, err)
	}
	os.Remove(filepath.Join(lockDir, e.RunID+".lock"))
	e.lock.Close()
	// Every test's teardown, so that none can forget it: the run's
	// processes, namespaces, directories, mounts, cgroups and files must
	// all be gone.
	if left := Leftovers(e.RunID); len(left) > 0 {
		e.t.Fatalf("harness: run %s left behind: %v", e.RunID, left)
	}
}

func newRunID() (string, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("run ID: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// LinkName returns a network interface name of this run: "fl", the run ID,
// then suffix (at most 7 characters, for the kernel's 15). Use it for links
// whose name is visible host-wide, such as WireGuard interfaces, whose
// userspace control socket is /var/run/wireguard/<name>.sock in every
// namespace; the harness removes those sockets when the run ends, and
// Sweep those of dead runs.
func (e *Env) LinkName(suffix string) string {
	if len(suffix) > 7 {
		e.fatalf("link name suffix %q: at most 7 characters", suffix)
	}
	return linkPrefix + e.RunID + suffix
}

const linkPrefix = "fl"

// name returns the harness name of an object of this run.
func (e *Env) name(suffix string) string { return Prefix + e.RunID + "-" + suffix }

// nextSegment hands out the index of a new LAN or routed segment.
func (e *Env) nextSegment() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.segments++
	return e.segments
}

func (e *Env) fatalf(format string, args ...any) {
	e.t.Helper()
	e.t.Fatalf("harness: "+format, args...)
}

// ArtifactsEnvVar names a directory where a failed run's process logs are
// copied before its run directory is removed (unset: they are not kept).
const ArtifactsEnvVar = "FLOTILLA_TEST_ARTIFACTS"

func (e *Env) keepLogs() {
	root := os.Getenv(ArtifactsEnvVar)
	if root == "" {
		e.t.Logf("harness: run %s failed; set %s=DIR to keep its process logs", e.RunID, ArtifactsEnvVar)
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(e.t.Name())
	dst := filepath.Join(root, name+"-"+e.RunID)
	if err := os.CopyFS(dst, os.DirFS(filepath.Join(e.Dir, "logs"))); err != nil {
		e.t.Logf("harness: keep the logs of run %s: %v", e.RunID, err)
		return
	}
	e.t.Logf("harness: run %s failed; its process logs are in %s", e.RunID, dst)
}
