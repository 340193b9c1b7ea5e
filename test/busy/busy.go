// Package busy keeps the machine's cores busy for benchmarks measured
// under load, and measures how busy the machine was while they ran.
//
// A benchmark runs its rounds once per level (busy loops beside it, 0
// and 2 by default: a quiet machine and one whose two cores are both
// taken), as sub-benchmarks named "busy-loops=N", and reports the share
// of the machine's CPU time spent busy while it measured as
// machine-busy-%, so its output says how loaded the machine was and not
// only how many loops it started. Run does all of that.
package busy

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// EnvVar names the levels to run in the benchmarks that use Levels
// without their own variable: DefaultLevels when it is unset.
const EnvVar = "FLOTILLA_BENCH_BUSY"

// DefaultLevels are Run's levels: quiet, then two busy loops.
const DefaultLevels = "0,2"

// Levels reads a comma-separated list of counts (busy loops, or any
// other level a benchmark runs at) from the environment variable env
// (def when it is unset).
func Levels(tb testing.TB, env, def string) []int {
	tb.Helper()
	var out []int
	for v := range strings.SplitSeq(cmp.Or(os.Getenv(env), def), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			tb.Fatalf("%s: %q is not a count", env, v)
		}
		out = append(out, n)
	}
	return out
}

// Name is the sub-benchmark name of a level.
func Name(loops int) string { return fmt.Sprintf("busy-loops=%d", loops) }

// Loops starts n shell busy loops (separate processes, so they compete
// for the CPUs as other workloads on the node would) and returns a
// function that stops them, and says whether one had ended before: they
// are stopped at the test's end too, and each ends by itself once the
// test process is gone.
//
// Not by Pdeathsig: the kernel sends it when the thread that started the
// child ends, and the Go runtime ends a thread whose goroutine exits
// while locked to it (as every netns switch of the e2e tests does), which
// killed the loops a second into a benchmark.
func Loops(tb testing.TB, n int) (stop func() error) {
	tb.Helper()
	return startLoops(tb, n).stop
}

// loops are the busy loops Loops started.
type loops []loop

type loop struct {
	proc *os.Process
	done chan struct{} // closed once it ended and was reaped
}

func startLoops(tb testing.TB, n int) *loops {
	tb.Helper()
	ls := &loops{}
	tb.Cleanup(func() { _ = ls.stop() })
	// kill -0 is the shell's own: each turn is a system call, and the
	// loop ends once the test process is gone.
	script := fmt.Sprintf("while kill -0 %d 2>/dev/null; do :; done", os.Getpid())
	for range n {
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			tb.Fatalf("starting a busy loop: %v", err)
		}
		l := loop{proc: cmd.Process, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(l.done) }()
		*ls = append(*ls, l)
	}
	return ls
}

// stop stops the loops and says whether one had ended before.
func (ls *loops) stop() error {
	var early int
	n := len(*ls)
	for _, l := range *ls {
		select {
		case <-l.done:
			early++
		default:
			_ = l.proc.Kill()
			<-l.done
		}
	}
	*ls = nil
	if early > 0 {
		return fmt.Errorf("%d of %d busy loops ended before they were stopped", early, n)
	}
	return nil
}

// Counters are the machine's CPU time counters (/proc/stat's first
// line, in clock ticks) at a mark.
type Counters struct{ busy, total uint64 }

// Mark reads the machine's CPU time counters; zero if unreadable.
func Mark() Counters {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Counters{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseCPULine(line)
}

// parseCPULine reads "cpu user nice system idle iowait irq softirq steal
// guest guest_nice".
func parseCPULine(line string) Counters {
	var c Counters
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "cpu" {
		return c
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest times are counted in user already
			break
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		c.total += n
		if i != 3 && i != 4 { // idle, iowait
			c.busy += n
		}
	}
	return c
}

// Since is the share of the machine's CPU time spent busy since the
// mark, in percent of all its cores (0 when nothing can be read).
func (c Counters) Since() float64 { return c.percent(Mark()) }

func (c Counters) percent(now Counters) float64 {
	if now.total <= c.total || now.busy < c.busy {
		return 0
	}
	return 100 * float64(now.busy-c.busy) / float64(now.total-c.total)
}

// BusySeconds is the CPU time the machine's cores spent busy up to the
// mark, in seconds of one core (a clock tick is 1/100 s on Linux).
func (c Counters) BusySeconds() float64 { return float64(c.busy) / 100 }

// LoadAverage is the machine's 1-minute load average now (0 if
// unreadable).
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// Run runs f once per level of EnvVar (DefaultLevels unless set) as a
// sub-benchmark named by Name, with that many busy loops running beside
// it, and reports how busy the machine was while f ran as
// machine-busy-%. What f sets up is its own; what the levels share is
// set up before Run.
func Run(b *testing.B, f func(b *testing.B)) {
	b.Helper()
	for _, n := range Levels(b, EnvVar, DefaultLevels) {
		b.Run(Name(n), func(b *testing.B) {
			stop := Loops(b, n)
			mark := Mark()
			f(b)
			b.ReportMetric(mark.Since(), "machine-busy-%")
			if err := stop(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
