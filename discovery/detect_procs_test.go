package discovery

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/test/busy"
)

// BenchmarkDetection with procs > 1 spreads its members over that many
// processes of this test binary, each a member group: a child that starts
// its members and answers one-line commands on stdin with one-line replies
// on stdout. Members of different groups gossip over loopback as members
// of one process do; only the garbage collector and the Go scheduler are
// no longer shared by all 100.

// groupEnv holds the number of members a member group starts.
const groupEnv = "FLOTILLA_DISCOVERY_GROUP"

// memberGroup is the parent's handle on one member group process.
type memberGroup struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	ids []string
}

// detectInGroups is one round of BenchmarkDetection with n members spread
// over procs member groups of the named profile.
func detectInGroups(b *testing.B, profile string, n, procs, hogs int, observe time.Duration) detectRun {
	// The first group's first member is everyone's seed.
	groups := []*memberGroup{startGroup(b, profile, n/procs+n%procs, "")}
	seed := groups[0].expect(b, "seed")
	for len(groups) < procs {
		groups = append(groups, startGroup(b, profile, n/procs, seed))
	}
	for _, g := range groups {
		for {
			id := g.expect(b, "member", "ready")
			if id == "" {
				break
			}
			g.ids = append(g.ids, id)
		}
	}
	last := groups[len(groups)-1]
	victim := last.ids[len(last.ids)-1]
	askAll(b, groups, fmt.Sprintf("converge %d", n), "converged")
	time.Sleep(time.Second) // let the join broadcasts drain
	askAll(b, groups, "watch "+victim, "watching")
	watchedAt := time.Now()
	udp0, udpErr := readUDPCounters()

	stop := busy.Loops(b, hogs)
	load := busy.Mark()
	time.Sleep(observe)
	r := detectRun{watchedAt: watchedAt}
	for _, reply := range askAll(b, groups, "stats", "stats") {
		var packets, bytes int64
		var cpu, alloc, gcs, elapsed float64
		if _, err := fmt.Sscan(reply, &packets, &bytes, &cpu, &alloc, &gcs, &elapsed); err != nil {
			b.Fatalf("member group stats %q: %v", reply, err)
		}
		r.packets += float64(packets) / elapsed / float64(n)
		r.bytes += float64(bytes) / elapsed / float64(n)
		r.cpu += cpu / elapsed
		r.alloc += alloc / elapsed / 1e6
		r.gcs += gcs / elapsed
	}

	// Every group counts the victim's death as true from now on.
	askAll(b, groups, "doom", "doomed")
	killed := parseNanos(b, last.ask(b, "kill "+victim, "killed"))
	r.killedAt = killed
	var lastDead time.Time
	for _, reply := range askAll(b, groups, "await "+victim, "dead") {
		lastDead = maxTime(lastDead, parseNanos(b, reply))
	}
	r.detect = lastDead.Sub(killed)
	r.busyPct, r.loadAvg = load.Since(), busy.LoadAverage()
	stop()
	if udp1, err := readUDPCounters(); err == nil && udpErr == nil {
		r.udpRcvbufErrors = udp1.RcvbufErrors - udp0.RcvbufErrors
		r.udpInErrors = udp1.InErrors - udp0.InErrors
	}

	r.falseDead = map[string]bool{}
	for _, reply := range askAll(b, groups, "report", "report") {
		f := strings.Fields(reply)
		events, _ := strconv.Atoi(f[0])
		r.falseEvents += events
		for _, id := range strings.Split(f[1], ",")[1:] {
			r.falseDead[id] = true
		}
		for _, ns := range strings.Split(f[2], ",")[1:] {
			d, _ := strconv.ParseInt(ns, 10, 64)
			r.rejoin = append(r.rejoin, time.Duration(d))
		}
	}
	var diags []groupDiag
	for _, reply := range askAll(b, groups, "diag", "diag") {
		var d groupDiag
		if err := json.Unmarshal([]byte(reply), &d); err != nil {
			b.Fatalf("member group diag: %v", err)
		}
		diags = append(diags, d)
	}
	for _, g := range groups {
		g.stop()
	}
	r.diagnose(b, diags)
	return r
}

// diagnose adds what the member groups saw to r and writes, for every
// false death, the evidence of its cause to stderr (a benchmark's log is
// cut after ten lines).
func (r *detectRun) diagnose(b *testing.B, diags []groupDiag) {
	for _, d := range diags {
		r.stallObserve = max(r.stallObserve, time.Duration(d.ObserveMax))
		r.stallDetect = max(r.stallDetect, time.Duration(d.DetectMax))
		r.stallP99 = max(r.stallP99, time.Duration(d.ObserveP99), time.Duration(d.DetectP99))
		r.rcvBuf = d.RcvBuf
		r.refutes += d.NoticeRefutes
		for _, ev := range d.Events {
			switch ev.Kind {
			case "suspect":
				r.suspicions++
			case "refute", "refute-dead":
				r.refutes++
				r.memberlistRefutes++
			case "queue-full":
				r.queueFull++
			}
		}
	}
	var inHand, late, unrefuted, gotSuspect, gotAlive int
	for _, d := range diags {
		for _, ev := range d.Events {
			switch ev.Kind {
			case "got-suspect":
				gotSuspect++
			case "got-alive":
				gotAlive++
			}
		}
	}
	for _, c := range explainFalseDeaths(diags, r.falseDead) {
		fmt.Fprintf(os.Stderr, "detect-diag: %s\n", c.relativeTo(r.watchedAt))
		switch {
		case len(c.refutedAt) == 0:
			unrefuted++
		case !c.observerGotRefute.IsZero() && !c.observerGotRefute.After(c.at):
			inHand++
		case !c.observerGotRefute.IsZero():
			late++
		}
		if c.memberStall >= 2*time.Second || c.observerStall >= 2*time.Second {
			r.stalledDeaths++
		}
	}
	for i, d := range diags {
		var s []string
		for _, st := range d.Stalls {
			if st.Late >= int64(500*time.Millisecond) {
				s = append(s, fmt.Sprintf("%+.2fs:%.2fs", time.Unix(0, st.End).Sub(r.watchedAt).Seconds(), time.Duration(st.Late).Seconds()))
			}
		}
		fmt.Fprintf(os.Stderr, "detect-diag: group %d stalls >= 0.5 s (end relative to watch: length): %s\n", i, strings.Join(s, " "))
	}
	fmt.Fprintf(os.Stderr, "detect-diag: victim killed at %+.2fs\n", r.killedAt.Sub(r.watchedAt).Seconds())
	fmt.Fprintf(os.Stderr, "detect-diag: false deaths whose observer had read the refutation before its timer fired: %d; read it after: %d; never refuted: %d (traced: %d suspicions of self read, %d new incarnations read)\n", inHand, late, unrefuted, gotSuspect, gotAlive)
	fmt.Fprintf(os.Stderr, "detect-diag: run: detect %.2fs, %d false deaths (%d with a process stalled >= 2 s), %d suspicions, %d refutations (%d by memberlist on gossip, the others on a notice), %d gossip messages dropped by memberlist, UDP receive errors %d (buffer %d), longest stall %.2fs observing and %.2fs detecting, p99 %.3fs\n",
		r.detect.Seconds(), len(r.falseDead), r.stalledDeaths, r.suspicions, r.refutes, r.memberlistRefutes, r.queueFull, r.udpRcvbufErrors+r.udpInErrors, r.rcvBuf, r.stallObserve.Seconds(), r.stallDetect.Seconds(), r.stallP99.Seconds())
	b.Logf("%d false deaths, %d with a process stalled >= 2 s; %d suspicions, %d refutations; UDP receive errors %d", len(r.falseDead), r.stalledDeaths, r.suspicions, r.refutes, r.udpRcvbufErrors+r.udpInErrors)
}

func startGroup(b *testing.B, profile string, members int, seed string) *memberGroup {
	bin, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		groupEnv+"="+strconv.Itoa(members),
		"FLOTILLA_BENCH_PROFILE="+profile,
		"FLOTILLA_SEEDS="+seed)
	cmd.Stderr = os.Stderr
	// A benchmark killed midway must not leave its members behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	g := &memberGroup{cmd: cmd}
	if g.in, err = cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	g.out = bufio.NewScanner(out)
	g.out.Buffer(nil, 1<<20)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.stop)
	return g
}

// stop closes the group's stdin, which stops its members, and waits.
func (g *memberGroup) stop() {
	if g.in != nil {
		_ = g.in.Close()
		g.in = nil
		_ = g.cmd.Wait()
	}
}

// expect reads lines until one starting with one of the words and returns
// the rest of it ("" for the second word, which ends a list); a line
// "error ..." fails the benchmark.
func (g *memberGroup) expect(b *testing.B, word string, end ...string) string {
	for g.out.Scan() {
		w, rest, _ := strings.Cut(g.out.Text(), " ")
		switch {
		case w == word:
			return rest
		case len(end) > 0 && w == end[0]:
			return ""
		case w == "error":
			b.Fatalf("member group: %s", rest)
		}
	}
	b.Fatalf("member group exited waiting for %q: %v", word, g.out.Err())
	return ""
}

func (g *memberGroup) ask(b *testing.B, cmd, reply string) string {
	g.send(b, cmd)
	return g.expect(b, reply)
}

func (g *memberGroup) send(b *testing.B, cmd string) {
	if _, err := fmt.Fprintln(g.in, cmd); err != nil {
		b.Fatalf("member group %s: %v", cmd, err)
	}
}

// askAll sends cmd to every group at once, then collects their replies,
// so the groups work in parallel.
func askAll(b *testing.B, groups []*memberGroup, cmd, reply string) []string {
	for _, g := range groups {
		g.send(b, cmd)
	}
	out := make([]string, len(groups))
	for i, g := range groups {
		out[i] = g.expect(b, reply)
	}
	return out
}

func parseNanos(b *testing.B, s string) time.Time {
	ns, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		b.Fatalf("member group time %q: %v", s, err)
	}
	return time.Unix(0, ns)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// groupProcess is a member group: it starts FLOTILLA_DISCOVERY_GROUP
// members of FLOTILLA_BENCH_PROFILE (seeded with FLOTILLA_SEEDS, or the
// first with none, whose address it prints as "seed"), prints "member
// <ID>" for each and "ready", then answers commands until stdin closes:
//
//	converge <n>   "converged" when each of its members sees n-1 alive
//	watch <victim> "watching": count false deaths from now, victim's
//	               until it is killed
//	stats          "stats <packets> <bytes> <cpu-s> <alloc bytes> <GCs>
//	               <seconds>" since watch
//	doom           "doomed": the victim's deaths are true from now on
//	kill <id>      "killed <unix ns>"
//	await <victim> "dead <unix ns>" once none of its members sees victim
//	report         "report <false-failed events> -[,id...] -[,ns...]":
//	               false deaths and how long each lasted
//	diag           "diag <JSON groupDiag>": stalls and memberlist's
//	               suspicions and refutations since watch
//
// A failure is "error <text>".
func groupProcess() int {
	members, _ := strconv.Atoi(os.Getenv(groupEnv))
	var tune func(*memberlist.Config)
	found := false
	for _, p := range benchProfiles {
		if p.name == os.Getenv("FLOTILLA_BENCH_PROFILE") {
			tune, benchNoRevival, benchNoNotice, found = p.tune, p.noRevival, p.noNotice, true
		}
	}
	if !found {
		fmt.Println("error unknown profile", os.Getenv("FLOTILLA_BENCH_PROFILE"))
		return 1
	}
	spec := os.Getenv("DISCOVERY_BENCH_TUNE")
	var sent sentCounter
	var diag groupDiag
	mlog := &eventLog{}
	counted := sent.tune(func(c *memberlist.Config) {
		if tune != nil {
			tune(c)
		}
		if err := applyTune(spec, c); err != nil {
			panic(err)
		}
	})
	tuned := func(c *memberlist.Config) {
		counted(c)
		// The tap reads memberlist's lines and passes them on: the
		// notice to suspected members is triggered by one of them.
		c.Logger = log.New(io.MultiWriter(logTap{member: c.Name, sink: mlog}, c.Logger.Writer()), "", 0)
		if t, ok := c.Transport.(*countingTransport).NodeAwareTransport.(*transport); ok {
			diag.RcvBuf = socketRcvBuf(t)
		}
		if os.Getenv("DISCOVERY_BENCH_TRACE") != "" {
			c.Transport = newTracingTransport(c.Transport.(memberlist.NodeAwareTransport), c.Name, testKey, mlog)
		}
	}
	stalls := startStallMeter()
	defer stalls.close()
	var seeds []string
	if s := os.Getenv("FLOTILLA_SEEDS"); s != "" {
		seeds = []string{s}
	}
	var nodes []*Discovery
	for range members {
		d, err := newBenchNode(tuned, seeds)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		if seeds == nil {
			seeds = []string{d.ml.LocalNode().Address()}
			fmt.Println("seed", seeds[0])
		}
		nodes = append(nodes, d)
	}
	defer func() {
		for _, d := range nodes {
			d.kill()
		}
	}()
	for _, d := range nodes {
		fmt.Println("member", d.selfID)
		diag.Members = append(diag.Members, d.selfID)
	}
	fmt.Println("ready")

	var deaths *deathWatch
	var mark costMark
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "converge":
			n, _ := strconv.Atoi(arg)
			if err := awaitGroup(func() bool {
				for _, d := range nodes {
					if len(d.Alive()) < n-1 {
						return false
					}
				}
				return true
			}); err != nil {
				fmt.Println("error no convergence:", err)
				return 1
			}
			fmt.Println("converged")
		case "watch":
			deaths = watchDeaths(nodes, arg)
			mark = markCost(&sent)
			stalls.mark()
			fmt.Println("watching")
		case "stats":
			elapsed := time.Since(mark.at).Seconds()
			packets, bytes, cpu, alloc, gcs := mark.since(&sent, 1)
			o, p := stalls.mark()
			diag.ObserveMax, diag.ObserveP99 = int64(o), int64(p)
			fmt.Println("stats", int64(packets*elapsed), int64(bytes*elapsed), cpu*elapsed, alloc*elapsed*1e6, gcs*elapsed, elapsed)
		case "doom":
			deaths.killed.Store(true)
			fmt.Println("doomed")
		case "kill":
			for i, d := range nodes {
				if d.selfID == arg {
					d.kill()
					nodes = append(nodes[:i], nodes[i+1:]...)
					break
				}
			}
			fmt.Println("killed", time.Now().UnixNano())
		case "await":
			if err := awaitGroup(func() bool {
				for _, d := range nodes {
					if d.sees(arg) {
						return false
					}
				}
				return true
			}); err != nil {
				fmt.Println("error victim not declared failed:", err)
				return 1
			}
			fmt.Println("dead", time.Now().UnixNano())
		case "report":
			dead, events, rejoin := deaths.falseDeaths()
			ids, durs := []string{"-"}, []string{"-"}
			for id := range dead {
				ids = append(ids, id)
			}
			for _, r := range rejoin {
				durs = append(durs, strconv.FormatInt(int64(r), 10))
			}
			fmt.Println("report", events, strings.Join(ids, ","), strings.Join(durs, ","))
		case "diag":
			o, p := stalls.mark()
			diag.DetectMax, diag.DetectP99 = int64(o), int64(p)
			stalls.mu.Lock()
			diag.Stalls = stalls.stalls
			stalls.mu.Unlock()
			diag.Events = mlog.take()
			diag.NoticeRefutes = 0
			for _, d := range nodes {
				diag.NoticeRefutes += int(testutil.ToFloat64(d.metrics.refutations))
			}
			j, err := json.Marshal(diag)
			if err != nil {
				fmt.Println("error", err)
				return 1
			}
			fmt.Println("diag", string(j))
		default:
			fmt.Println("error unknown command", cmd)
			return 1
		}
	}
	return 0
}

// awaitGroup polls done every 5 ms for up to a minute, like the
// in-process benchmark.
func awaitGroup(done func() bool) error {
	start := time.Now()
	for !done() {
		if time.Since(start) > time.Minute {
			return fmt.Errorf("not within a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
