package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
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
	// quiet processes (control-plane components) print no tail when the
	// test fails, unless they had exited.
	quiet bool
	// stopped is set once the harness or the test asked the process to
	// end (Stop, Kill): an exit after that is not a crash.
	stopped bool
}

func (p *Process) markStopped() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
}

func (p *Process) stopRequested() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
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
	if err := startFromSpawner(cmd); err != nil {
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
		exited, err := p.Exited()
		crashed := exited && !p.stopRequested()
		// Read before the stop, whose own lines would match.
		var troubles string
		if e.t.Failed() && p.quiet && !crashed {
			troubles = p.troubles(3)
		}
		p.Stop()
		if !e.t.Failed() {
			return
		}
		if troubles != "" {
			// A quiet process prints no tail, but a control plane that
			// stalled or was shutting down explains a failure that the
			// test's own message does not.
			e.t.Logf("harness: %s logged signs of trouble; %s", name, troubles)
		}
		// A CI log keeps only its end, and the test's own failure is
		// printed before these: keep them short. A process that died on
		// its own gets its full tail; a live one the INFO and above of
		// its last lines, and only when it is one the test watches.
		switch {
		case crashed:
			e.t.Logf("harness: %s had exited (%v); last lines:\n%s", name, err, p.Tail(30))
		case !p.quiet:
			e.t.Logf("harness: last lines of %s (debug lines left out; whole log: %s):\n%s", name, p.LogPath, p.TailAbove(12, "level=DEBUG"))
		}
	})
	return p, nil
}

// The kernel sends Pdeathsig when the thread that forked the child exits,
// not the process. Netns.Do ends threads on purpose, so every harness
// process is forked from one thread that is locked for the life of the
// test binary.
var spawner = struct {
	once sync.Once
	reqs chan spawnRequest
}{reqs: make(chan spawnRequest)}

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

// StartCommand starts cmd from the harness's spawning thread, for a test
// that runs a command of its own with Pdeathsig set: started from the
// test's goroutine, its thread may be one that Netns.Do ends later, and the
// kernel would kill the command then.
func StartCommand(cmd *exec.Cmd) error { return startFromSpawner(cmd) }

func startFromSpawner(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must not exit
			for r := range spawner.reqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd, errc}
	return <-errc
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
// A terminating signal counts as a stop the test asked for.
func (p *Process) Signal(sig syscall.Signal) error {
	if sig == syscall.SIGTERM || sig == syscall.SIGINT || sig == syscall.SIGKILL {
		p.markStopped()
	}
	return p.Cmd.Process.Signal(sig)
}

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill() {
	p.markStopped()
	syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM to the process group, waits up to StopTimeout, then
// kills it. It returns the process's wait error (nil for exit status 0).
func (p *Process) Stop() error {
	if exited, err := p.Exited(); exited {
		return err
	}
	p.markStopped()
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

// exitError says that the process exited on its own: first the last
// error it logged, which names the cause (kubelet's "Failed to start
// cAdvisor" err="..."), then its last lines.
func (p *Process) exitError() error {
	_, err := p.Exited()
	reason := p.lastError()
	if reason == "" {
		reason = "it logged no error"
	}
	return fmt.Errorf("%s exited (%v): %s\nlast lines of %s (log: %s):\n%s", p.Name, err, reason, p.Name, p.LogPath, p.Tail(15))
}

// klogError matches the header of an error or fatal line of klog
// (Kubernetes components): "E1123 16:00:00.013897   30735 kubelet.go:1687] ".
var klogError = regexp.MustCompile(`^[EF]\d{4} [\d:.]+\s+\d+ [^\]]*\] `)

// lastError returns the last error line of the process's log, in klog's
// format (without its header) or logrus's (containerd's level=error or
// level=fatal), or "".
func (p *Process) lastError() string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if h := klogError.FindString(l); h != "" {
			return l[len(h):]
		}
		if strings.Contains(l, "level=error") || strings.Contains(l, "level=fatal") {
			return l
		}
	}
	return ""
}

// troubleLine matches what a control-plane component logs when it is the
// reason its clients failed: etcd's requests and disk writes that took
// seconds, an API server's graceful termination, its in-flight limit.
var troubleLine = regexp.MustCompile(`took too long \([0-9.]+s\)|slow fdatasync|sync duration of|\[graceful-termination\] shutdown event|[Tt]oo many requests`)

// troubles says how many lines of the process's log match troubleLine,
// and the last n of them (each cut to 300 bytes), or "" when none does.
func (p *Process) troubles(n int) string {
	var found []string
	for _, l := range strings.Split(p.Log(), "\n") {
		if troubleLine.MatchString(l) {
			found = append(found, l[:min(len(l), 300)])
		}
	}
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("%d lines, the last:\n%s", len(found), strings.Join(found[max(0, len(found)-n):], "\n"))
}

// Log returns what the process has printed so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail returns the last n lines of the process's output.
func (p *Process) Tail(n int) string { return p.TailAbove(n, "") }

// TailAbove returns the last n lines of the process's output that do not
// contain skip (when skip is not empty).
func (p *Process) TailAbove(n int, skip string) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if skip != "" {
		kept := lines[:0]
		for _, l := range lines {
			if !strings.Contains(l, skip) {
				kept = append(kept, l)
			}
		}
		lines = kept
	}
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
