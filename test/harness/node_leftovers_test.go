package harness_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// helperEnv tells TestRealNodeHelper, run in a child test binary, how to
// end: "fail" fails the test, "kill" waits to be killed.
const helperEnv = "FLOTILLA_NODE_HELPER"

// A test with a real node and a running pod leaves nothing behind when it
// fails, and a sweep removes everything when its test binary is killed:
// processes (containers included), mounts, cgroups, links, namespaces,
// files and the sysctls kubelet changed.
func TestRealNodesLeaveNothing(t *testing.T) {
	harness.Require(t, harness.NeedsNodes...)
	// The sysctls are host-wide: no other run's kubelets may change them
	// while this test compares them (other packages run at the same time).
	harness.HoldNodesAlone(t)
	// The witness that the harness restores anything needs kubelet to
	// change something: a host whose values already are kubelet's gets
	// others for the test, and its own back at the end.
	if kubeletSysctls(t) == kubeletValues {
		restore := sysctlValues(t)
		setSysctls(t, map[string]string{"vm/overcommit_memory": "0", "kernel/panic": "0", "kernel/panic_on_oops": "0"})
		t.Cleanup(func() { setSysctls(t, restore) })
	}
	for _, mode := range []string{"fail", "kill"} {
		t.Run(mode, func(t *testing.T) {
			runFile := filepath.Join(t.TempDir(), "run")
			cmd := exec.Command(os.Args[0], "-test.run", "^TestRealNodeHelper$", "-test.count", "1", "-test.v")
			cmd.Env = append(os.Environ(), helperEnv+"="+mode+":"+runFile)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			before := kubeletSysctls(t)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// A check below that fails must not leave the child waiting to
			// be killed; the run's leftovers then go with the next sweep.
			t.Cleanup(func() { cmd.Process.Kill() })
			run := waitHelper(t, cmd, exited, runFile, &out)
			var live []string // what the run had when it was killed
			// kubelet changes host-wide sysctls; the harness restores them.
			if during := kubeletSysctls(t); during == before {
				t.Fatalf("kubelet left the sysctls as they were (%s): nothing to restore", during)
			}
			if mode == "kill" {
				// The witness: the node is up, with its pod, its mounts and
				// its cgroups, when the test binary dies.
				live = harness.Leftovers(run)
				left := strings.Join(live, "\n")
				for _, kind := range []string{"mount ", "cgroup ", "netns ", "process ", "file /run/containerd/s/"} {
					if !strings.Contains(left, kind) {
						t.Fatalf("no %s of the live run %s to leave behind:\n%s", kind, run, left)
					}
				}
				cmd.Process.Signal(syscall.SIGKILL)
			}
			err := <-exited
			if err == nil {
				t.Fatalf("the helper test passed; want it failed or killed:\n%s", out.String())
			}
			if mode == "fail" && !strings.Contains(out.String(), "deliberate failure") {
				t.Fatalf("the helper test failed before its node was up: %v\n%s", err, out.String())
			}
			if mode == "kill" {
				if err := harness.Sweep(); err != nil {
					t.Fatalf("sweep: %v", err)
				}
			}
			if left := harness.Leftovers(run); len(left) > 0 {
				t.Fatalf("run %s (%s) left behind: %v\nhelper output:\n%s", run, mode, left, out.String())
			}
			// Host-wide files of the killed run, found while its directory
			// was there: gone too.
			for _, l := range live {
				if f, ok := strings.CutPrefix(l, "file "); ok {
					if _, err := os.Lstat(f); err == nil {
						t.Errorf("%s of the killed run is still there", f)
					}
				}
			}
			if after := kubeletSysctls(t); after != before {
				t.Fatalf("sysctls %s after the run, %s before", after, before)
			}
		})
	}
}

// waitHelper waits until the helper has written "<run> ready" to runFile.
func waitHelper(t *testing.T, cmd *exec.Cmd, exited <-chan error, runFile string, out *strings.Builder) string {
	t.Helper()
	timeout := time.After(3 * time.Minute)
	for {
		b, _ := os.ReadFile(runFile)
		if run, ok := strings.CutSuffix(string(b), " ready"); ok {
			return run
		}
		select {
		case err := <-exited:
			t.Fatalf("the helper test ended (%v) before its node was up:\n%s", err, out.String())
		case <-timeout:
			cmd.Process.Kill()
			<-exited
			t.Fatalf("the helper test did not bring its node up:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kubeletSysctls reads the host-wide sysctls kubelet sets.
// kubeletValues is what kubeletSysctls reads while a kubelet runs.
const kubeletValues = "vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1"

func sysctlValues(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kv := range strings.Fields(kubeletSysctls(t)) {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func setSysctls(t *testing.T, vals map[string]string) {
	t.Helper()
	for k, v := range vals {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			t.Fatalf("set %s=%s: %v", k, v, err)
		}
	}
}

func kubeletSysctls(t *testing.T) string {
	t.Helper()
	var vals []string
	for _, k := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, k+"="+strings.TrimSpace(string(b)))
	}
	return strings.Join(vals, " ")
}

// TestRealNodeHelper is TestRealNodesLeaveNothing's child: a node with a
// running pod, then a failure or a wait to be killed.
func TestRealNodeHelper(t *testing.T) {
	mode, runFile, ok := strings.Cut(os.Getenv(helperEnv), ":")
	if !ok {
		t.Skip("run by TestRealNodesLeaveNothing")
	}
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
	cp.StartNode("n1", harness.NodeOptions{})
	runTestServers(t, cp, "web", 1, nil)
	if err := os.WriteFile(runFile, []byte(env.RunID+" ready"), 0o644); err != nil {
		t.Fatal(err)
	}
	if mode == "kill" {
		<-context.Background().Done()
	}
	t.Fatal("deliberate failure, with a node and a pod running")
}
