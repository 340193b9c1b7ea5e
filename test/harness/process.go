package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a long-running process started by the harness. Its output goes
// to a log file in the run directory; it is stopped when the test ends.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string

	done    chan struct{}
	mu      sync.Mutex
	waitErr error
}

// StopTimeout is how long Stop waits after SIGTERM before SIGKILL.
const StopTimeout = 10 * time.Second

// Start runs argv in the root network namespace until the test ends.
func (e *Env) Start(name string, argv ...string) *Process {
	e.t.Helper()
	p, err := e.start(name, nil, argv)
	if err != nil {
		e.fatalf("start %s: %v", name, err)
	}
	return p
}

func (e *Env) start(name string, prefix []string, argv []string) (*Process, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command")
	}
	full := append(append([]string{}, prefix...), argv...)
	logPath := filepath.Join(e.Dir, "logs", name+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), runEnvVar+"="+e.RunID)
	// Own process group so Stop reaches children; killed with the test
	// binary should that die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		p.Stop()
		if e.t.Failed() {
			e.t.Logf("harness: last lines of %s:\n%s", name, p.Tail(30))
		}
	})
	return p, nil
}

// Pid returns the process ID.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its wait error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill() {
	syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM to the process group, waits up to StopTimeout, then
// kills it. It returns the process's wait error (nil for exit status 0).
func (p *Process) Stop() error {
	if exited, err := p.Exited(); exited {
		return err
	}
	syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(StopTimeout):
		syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.done
	}
	_, err := p.Exited()
	return err
}

// Log returns what the process has printed so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail returns the last n lines of the process's output.
func (p *Process) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(toBytes(lines), []byte("\n")))
}

func toBytes(lines []string) [][]byte {
	out := make([][]byte, len(lines))
	for i, l := range lines {
		out[i] = []byte(l)
	}
	return out
}
