package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-io/flotilla/peering"
)

// The steps of a peering as the agents log them (docs/peering.md,
// "Timeline"), in the order they usually come.
var agentSteps = []peering.Step{
	peering.StepJoined, peering.StepStatementSent, peering.StepStatementReceived, peering.StepViewsAgreed,
	peering.StepDataPath, peering.StepHandshake, peering.StepStatus,
}

// The benchmark's own observations, after the agents' steps.
const (
	stepViewRead    peering.Step = "view-read"    // the view arrived through the benchmark's watch
	stepFirstPacket peering.Step = "first-packet" // the first TCP connection completed
)

// Start-up, per agent: from the exec to the first of these lines.
var startupSteps = []struct{ name, msg string }{
	{"process", "agent starting"},
	{"networks", "cluster networks"},
	{"data path", "data path applied"}, // CRDs, tunnel, engine restored
	{"gossip", "gossip started"},       // after the Peer informer synced
	{"started", "components started"},
}

// logLine is a line an agent logged (JSON), as read for timelines; Text
// is the whole line.
type logLine struct {
	Text      string       `json:"-"`
	Time      time.Time    `json:"time"`
	Msg       string       `json:"msg"`
	Step      peering.Step `json:"step"`
	Peer      string       `json:"peer"`
	At        time.Time    `json:"at"`
	ClusterID string       `json:"clusterID"`
	Name      string       `json:"name"`
	// LastRenewal: the leader election's fence lines.
	LastRenewal time.Time `json:"lastRenewal"`
}

// parseLogLine is one line of an agent's JSON log; a line that is not
// JSON has only its Text.
func parseLogLine(text string) logLine {
	l := logLine{Text: text}
	_ = json.Unmarshal([]byte(text), &l)
	return l
}

// readLogs fills r.steps and r.startup from this round's lines of every
// agent's log.
func (r *round) readLogs() error {
	names := map[string]string{} // cluster ID -> cluster name
	lines := map[string][]logLine{}
	for name, a := range r.agents {
		f, err := os.Open(a.c.Agent.LogPath)
		if err != nil {
			return err
		}
		if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
			f.Close()
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		starts := 0
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue // not a log line of the agent's own
			}
			if l.Msg == "agent starting" {
				if starts++; starts > 1 {
					break // the next round's
				}
			}
			if l.Msg == "identity" && l.ClusterID != "" {
				names[l.ClusterID] = name
			}
			lines[name] = append(lines[name], l)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return fmt.Errorf("read log of agent %s: %w", name, err)
		}
	}
	r.steps, r.startup = map[pair]map[peering.Step]time.Time{}, map[string]map[string]time.Time{}
	for name, ls := range lines {
		up := map[string]time.Time{"exec": r.agents[name].started}
		for _, l := range ls {
			for _, s := range startupSteps {
				if l.Msg == s.msg {
					if _, ok := up[s.name]; !ok {
						up[s.name] = l.Time
					}
				}
			}
			if l.Msg != peering.StepMessage || names[l.Peer] == "" {
				continue
			}
			k := pair{name, names[l.Peer]}
			if r.steps[k] == nil {
				r.steps[k] = map[peering.Step]time.Time{}
			}
			at := l.Time
			if !l.At.IsZero() {
				at = l.At
			}
			if _, ok := r.steps[k][l.Step]; !ok {
				r.steps[k][l.Step] = at
			}
		}
		r.startup[name] = up
	}
	for k, t := range r.seen {
		r.step(k)[stepViewRead] = t
	}
	for k, t := range r.packet {
		r.step(k)[stepFirstPacket] = t
	}
	return nil
}

func (r *round) step(k pair) map[peering.Step]time.Time {
	if r.steps[k] == nil {
		r.steps[k] = map[peering.Step]time.Time{}
	}
	return r.steps[k]
}

// spread is the median, min and max of some durations, and how many.
type spread struct {
	n                int
	median, min, max time.Duration
}

func spreadOf(ds []time.Duration) spread {
	if len(ds) == 0 {
		return spread{}
	}
	slices.Sort(ds)
	return spread{n: len(ds), median: ds[len(ds)/2], min: ds[0], max: ds[len(ds)-1]}
}

func (s spread) String() string {
	if s.n == 0 {
		return fmt.Sprintf("%8s %8s %8s %4d", "-", "-", "-", 0)
	}
	f := func(d time.Duration) string { return fmt.Sprintf("%.0f", ms(d)) }
	return fmt.Sprintf("%8s %8s %8s %4d", f(s.median), f(s.min), f(s.max), s.n)
}

// breakdown prints, per step, when it happened after the round started
// (median, min and max over every direction of every round) and the
// median time it took after the step before it in the same direction.
func breakdown(title string, rounds []*round, total []time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "timeline %s, %d rounds: ms after the agent's exec (start-up) or the round's start (steps); median min max n\n", title, len(rounds))
	prev := "exec"
	for _, s := range startupSteps {
		var at, gap []time.Duration
		for _, r := range rounds {
			for _, up := range r.startup {
				t, ok := up[s.name]
				if !ok {
					continue
				}
				at = append(at, t.Sub(up["exec"]))
				if p, ok := up[prev]; ok {
					gap = append(gap, t.Sub(p))
				}
			}
		}
		fmt.Fprintf(&b, "  start-up %-19s %s   +%s after %s\n", s.name, spreadOf(at), medianMS(gap), prev)
		prev = s.name
	}
	steps := append(slices.Clone(agentSteps), stepViewRead, stepFirstPacket)
	for i, s := range steps {
		var at, gap []time.Duration
		for _, r := range rounds {
			for _, ts := range r.steps {
				t, ok := ts[s]
				if !ok {
					continue
				}
				at = append(at, t.Sub(r.start))
				if i > 0 {
					if p, ok := ts[steps[i-1]]; ok {
						gap = append(gap, t.Sub(p))
					}
				}
			}
		}
		after := ""
		if i > 0 {
			after = fmt.Sprintf("   +%s after %s", medianMS(gap), steps[i-1])
		}
		fmt.Fprintf(&b, "  %-28s %s%s\n", s, spreadOf(at), after)
	}
	fmt.Fprintf(&b, "  %-28s %s\n", "all directions (round)", spreadOf(slices.Clone(total)))
	return b.String()
}

func medianMS(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f ms", ms(spreadOf(ds).median))
}
