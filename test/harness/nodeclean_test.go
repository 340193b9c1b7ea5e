package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a`:             "/tmp/a",
		`/tmp/with\040space`: "/tmp/with space",
		`/tmp/tab\011x`:      "/tmp/tab\tx",
		`/tmp/short\04`:      `/tmp/short\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFirstTempComponent(t *testing.T) {
	tmp := os.TempDir()
	for in, want := range map[string]string{
		filepath.Join(tmp, "flotest-abc123-1/cp/nodes/w1/pod-logs/x.log"): "flotest-abc123-1",
		filepath.Join(tmp, "flotest-abc123-1"):                            "flotest-abc123-1",
		"/var/log/pods/x.log":                                             "",
		tmp:                                                               ".",
	} {
		if got := firstTempComponent(in); got != want {
			t.Errorf("firstTempComponent(%q) = %q, want %q", in, got, want)
		}
	}
}

// A node's cgroup is made in every hierarchy, holds what is started in it,
// and removeCgroup kills that and removes the cgroup with its children.
func TestCgroupLifecycle(t *testing.T) {
	Require(t, Root, CgroupV1Memory)
	name := Prefix + "000000-cgtest"
	t.Cleanup(func() { removeCgroup(name) })
	if err := createCgroup(name); err != nil {
		t.Fatal(err)
	}
	hs := cgroupHierarchies()
	var memory string
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, name)); err != nil {
			t.Fatalf("cgroup missing in %s: %v", h, err)
		}
		if filepath.Base(h) == "memory" {
			memory = h
		}
	}
	if memory == "" {
		t.Fatalf("no memory hierarchy among %v", hs)
	}
	child := filepath.Join(memory, name, "kubepods", "pod1")
	if err := os.MkdirAll(child, 0o755); err != nil {
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "300")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	go sleep.Wait()
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if pids := cgroupProcesses(name); len(pids) != 1 || pids[0] != sleep.Process.Pid {
		t.Fatalf("processes in the cgroup: %v, want [%d]", pids, sleep.Process.Pid)
	}
	if err := removeCgroup(name); err != nil {
		t.Fatal(err)
	}
	if unix.Kill(sleep.Process.Pid, 0) == nil {
		// A zombie until Wait reaps it; its cgroup is gone either way.
		if st, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(sleep.Process.Pid), "stat")); len(st) > 0 && !containsState(st, 'Z') {
			t.Errorf("process %d in the removed cgroup still runs", sleep.Process.Pid)
		}
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, name)); !os.IsNotExist(err) {
			t.Errorf("cgroup left in %s: %v", h, err)
		}
	}
}

func containsState(stat []byte, state byte) bool {
	// pid (comm) S ...: the state follows the last ')'.
	for i := len(stat) - 1; i >= 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == state
		}
	}
	return false
}

// removeRunDir unmounts stacked mounts inside a run directory first, and
// what was mounted there (here a directory outside the run) keeps its
// files.
func TestRemoveRunDirUnmountsFirst(t *testing.T) {
	Require(t, Root)
	outside := t.TempDir()
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	run, err := os.MkdirTemp("", Prefix+"000000-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountUnder(run); os.RemoveAll(run) })
	point := filepath.Join(run, "kubelet", "pods", "x")
	if err := os.MkdirAll(point, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 { // stacked, as kubelet's rshared root gets
		if err := unix.Mount(outside, point, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := mountsUnder(run); len(got) != 1 {
		t.Fatalf("mountsUnder = %v, want the one mount point", got)
	}
	if err := removeRunDir(run); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("run directory still there: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a file of the mounted directory was removed: %v", err)
	}
}
