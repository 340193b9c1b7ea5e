package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// `make demo` brings a federation of real nodes up (the agents as pods
// from kubectl apply -k, real pods talking across the overlap), and
// Ctrl-C tears all of it down.
func TestDemoUpAndDown(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	bin := harness.Flotilla(t)
	demo := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", demo, "github.com/flotilla-io/flotilla/test/demo").CombinedOutput(); err != nil {
		t.Fatalf("build demo: %v\n%s", err, out)
	}
	cmd := exec.Command(demo, "-flotilla", bin)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := harness.StartCommand(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })

	var run string
	var seen []string
	runLine := regexp.MustCompile(`^demo: run ([0-9a-f]{6}):`)
	lines := bufio.NewScanner(stdout)
	ready := false
	for lines.Scan() {
		line := lines.Text()
		seen = append(seen, line)
		if m := runLine.FindStringSubmatch(line); m != nil {
			run = m[1]
		}
		if strings.Contains(line, "press Ctrl-C") {
			ready = true
			break
		}
	}
	if !ready || run == "" {
		cmd.Wait()
		t.Fatalf("demo did not come up:\n%s", strings.Join(seen, "\n"))
	}
	output := strings.Join(seen, "\n")
	for _, want := range []string{
		"kubectl get pods -n flotilla-system", "flotilla-agent-", "Running",
		"CLUSTER", "Connected",
		"flotest-" + run + "-cp1-gw", "flotest-" + run + "-cp2-gw", "10.0.0.0/16",
		"Pod-to-pod across the overlap", "answered and saw the caller", "node w1", "web-w1",
		"Offloading:", "flotilla grant", "flotilla offload namespace shop", "Deployment shop/web", "answered by web-",
		"KUBECONFIG=", "get peers -o wide", "logs deployment/flotilla-agent", "nsenter --net=", "wg show", "nft list table ip flotilla",
	} {
		if !strings.Contains(output, want) {
			t.Errorf("demo output lacks %q:\n%s", want, output)
		}
	}
	if left := harness.Leftovers(run); len(left) == 0 {
		t.Fatal("demo reports ready but nothing of its run exists")
	}

	cmd.Process.Signal(syscall.SIGINT)
	stopped := time.Now()
	done := make(chan error, 1)
	var mu sync.Mutex
	var after []string // what the demo said after Ctrl-C, timed from it
	go func() {
		for lines.Scan() {
			mu.Lock()
			after = append(after, fmt.Sprintf("+%s %s", time.Since(stopped).Round(100*time.Millisecond), lines.Text()))
			mu.Unlock()
		}
		done <- cmd.Wait()
	}()
	// A guard against a hang, not a measure: the teardown (the agents
	// uninstalled and checked gone, every node and control plane stopped)
	// took over 2 minutes at a load average of 28.
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo exit after Ctrl-C: %v", err)
		}
		t.Logf("demo torn down %s after Ctrl-C", time.Since(stopped).Round(100*time.Millisecond))
	case <-time.After(5 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("demo still running 5 minutes after Ctrl-C; it said since:\n%s", strings.Join(after, "\n"))
	}
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("demo left behind: %v", left)
	}
}
