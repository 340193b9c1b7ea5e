package busy

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseCPULine(t *testing.T) {
	c := parseCPULine("cpu  100 5 50 800 40 3 2 0 7 0")
	if c.total != 1000 || c.busy != 160 {
		t.Fatalf("counters %+v, want total 1000 busy 160 (guest not counted twice, idle and iowait not busy)", c)
	}
	if got := (Counters{}).percent(Counters{busy: 150, total: 200}); got != 75 {
		t.Fatalf("percent %v, want 75", got)
	}
	if got := c.percent(c); got != 0 {
		t.Fatalf("percent over no time %v, want 0", got)
	}
	if c := parseCPULine("cpu0 1 2 3 4"); c != (Counters{}) {
		t.Fatalf("a per-core line read as the machine's: %+v", c)
	}
}

func TestLoopsKeepTheMachineBusy(t *testing.T) {
	mark := Mark()
	stop := Loops(t, 2)
	time.Sleep(500 * time.Millisecond)
	pct := mark.Since()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Two loops take two cores, or their share of more; whatever else
	// runs only adds to it.
	cores := 0
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "cpu") && !strings.HasPrefix(line, "cpu ") {
			cores++
		}
	}
	if want := 60 * float64(min(2, cores)) / float64(cores); pct < want {
		t.Fatalf("machine %.1f %% busy with two busy loops on %d cores, want at least %.0f %%", pct, cores, want)
	}
	t.Logf("machine %.1f %% busy with two busy loops", pct)
}

func TestLevels(t *testing.T) {
	t.Setenv("BUSY_TEST_LEVELS", "0, 2")
	if got := Levels(t, "BUSY_TEST_LEVELS", "1"); len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Fatalf("levels %v, want [0 2]", got)
	}
	if got := Levels(t, "BUSY_TEST_UNSET", "3"); len(got) != 1 || got[0] != 3 {
		t.Fatalf("default levels %v, want [3]", got)
	}
}

// A loop that ends before it is stopped (killed by someone else) is
// reported, not taken for load it never made.
func TestLoopsSayWhenOneEndedEarly(t *testing.T) {
	ls := startLoops(t, 2)
	first := (*ls)[0]
	if err := first.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	if err := ls.stop(); err == nil || !strings.Contains(err.Error(), "1 of 2 busy loops ended before") {
		t.Fatalf("stop after a loop was killed: %v, want it said", err)
	}
}
