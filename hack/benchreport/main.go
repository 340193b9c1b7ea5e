// Command benchreport reads what `go test -bench` printed (make bench
// saves it) and prints one table: each benchmark's figure, its target,
// whether it is met, its anchor and the figure's ratio to the anchor.
// With -docs it writes the same table into docs/benchmarks.md between
// its markers; a row this run has no figure for keeps the one written
// before, so one benchmark run alone updates its row only.
//
//	go test -run '^$' -bench . ./... | tee bench.txt
//	go run ./hack/benchreport -docs docs/benchmarks.md bench.txt
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	docs := flag.String("docs", "", "write the table into this file, between "+beginMarker+" and "+endMarker)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchreport [-docs FILE] [BENCH-OUTPUT...]\n"+
			"Reads go test -bench output (standard input when no file is named) and prints the report.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*docs, flag.Args(), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(docs string, files []string, stdin io.Reader, stdout io.Writer) error {
	var runs results
	if len(files) == 0 {
		r, err := parse(stdin)
		if err != nil {
			return fmt.Errorf("standard input: %w", err)
		}
		runs = r
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		r, err := parse(fh)
		fh.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		runs.merge(r)
	}
	var before map[string][]string
	var doc []byte
	if docs != "" {
		var err error
		if doc, err = os.ReadFile(docs); err != nil {
			return err
		}
		if before, err = writtenRows(string(doc)); err != nil {
			return fmt.Errorf("%s: %w", docs, err)
		}
	}
	if _, err := io.WriteString(stdout, render(rows(runs, before, true))); err != nil {
		return err
	}
	if docs == "" {
		return nil
	}
	// The document holds the figures; the load they were measured at is
	// in the run's output.
	out, err := replaceSection(string(doc), render(rows(runs, before, false)))
	if err != nil {
		return fmt.Errorf("%s: %w", docs, err)
	}
	return os.WriteFile(docs, []byte(out), 0o644)
}

// result is one benchmark's metrics, by unit.
type result map[string]float64

// results are what a run printed: each benchmark's metrics by package
// and name, why those skipped were, and the load the run stated (each
// figure of the run carries it).
type results struct {
	metrics map[string]result // key: package + " " + benchmark
	skipped map[string]string // same key: the reason printed
	load    []string
}

func key(pkg, bench string) string { return pkg + " " + bench }

func (r *results) merge(o results) {
	if r.metrics == nil {
		r.metrics, r.skipped = map[string]result{}, map[string]string{}
	}
	for k, v := range o.metrics {
		r.metrics[k] = v
	}
	for k, v := range o.skipped {
		r.skipped[k] = v
	}
	r.load = append(r.load, o.load...)
}

var (
	// BenchmarkX/sub-2   5   123 ns/op   54.0 ms-to-ready
	// (not a benchmark's own print, "BenchmarkX: 5 rounds ...")
	resultLine = regexp.MustCompile(`^(Benchmark[^\s:]+?)(?:-\d+)?\s+(\d+)\s+(.+)$`)
	// A benchmark whose output on stderr came between its name and its
	// figures: the name, then the figures alone on a later line.
	nameLine    = regexp.MustCompile(`^(Benchmark[^\s:]+?)(?:-\d+)? *\t`)
	figuresLine = regexp.MustCompile(`^\s+(\d+)\t(.+)$`)
	skipLine    = regexp.MustCompile(`^\s*--- SKIP: (Benchmark\S+)`)
	procSuffix  = regexp.MustCompile(`-\d+$`)
)

// parse reads go test -bench output: "pkg:" lines name the package of
// the results after them; "# load" lines (make bench writes them) state
// the machine's load.
func parse(in io.Reader) (results, error) {
	r := results{metrics: map[string]result{}, skipped: map[string]string{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	pkg, skipping, named := "", "", ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg, skipping = strings.TrimPrefix(strings.TrimPrefix(line, "pkg: "), root), ""
		case strings.HasPrefix(line, "# load"):
			r.load = append(r.load, strings.TrimSpace(strings.TrimPrefix(line, "#")))
		case skipLine.MatchString(line):
			skipping = key(pkg, procSuffix.ReplaceAllString(skipLine.FindStringSubmatch(line)[1], ""))
		case skipping != "" && strings.HasPrefix(line, "    "):
			// The reason, as "file.go:12: reason"; the first line is kept.
			if _, ok := r.skipped[skipping]; !ok {
				reason := strings.TrimSpace(line)
				if _, after, ok := strings.Cut(reason, ": "); ok && strings.Contains(reason[:len(reason)-len(after)], ".go:") {
					reason = after
				}
				r.skipped[skipping] = reason
			}
		default:
			skipping = ""
			name, figures := "", ""
			if m := resultLine.FindStringSubmatch(line); m != nil {
				name, figures = m[1], m[3]
			} else if m := figuresLine.FindStringSubmatch(line); m != nil && named != "" {
				name, figures = named, m[2]
			} else if m := nameLine.FindStringSubmatch(line); m != nil {
				named = m[1]
				continue
			}
			if name == "" {
				continue
			}
			named = ""
			metrics, err := parseMetrics(figures)
			if err != nil {
				return r, fmt.Errorf("%s: %w", name, err)
			}
			r.metrics[key(pkg, name)] = metrics
		}
	}
	return r, sc.Err()
}

// parseMetrics reads "value unit" pairs.
func parseMetrics(s string) (result, error) {
	f := strings.Fields(s)
	if len(f)%2 != 0 {
		return nil, fmt.Errorf("metrics %q: not value and unit pairs", s)
	}
	out := result{}
	for i := 0; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return nil, fmt.Errorf("metric %q %q: %w", f[i], f[i+1], err)
		}
		out[f[i+1]] = v
	}
	return out, nil
}

// row is a rendered row of the table.
type row struct {
	name, figure, target, met, anchor, ratio string
}

// rows renders every figure: from this run when it has one (with the
// load the run stated, if withLoad), else the one written before (with
// its verdict and ratio), else why there is none. Targets and anchors
// are always figures' own.
func rows(runs results, before map[string][]string, withLoad bool) []row {
	out := make([]row, 0, len(figures))
	for _, f := range figures {
		r := row{name: f.Name, target: f.targetText(), anchor: f.Anchor}
		m, sub, ok := runs.find(f)
		switch {
		case ok:
			v, has := m[f.Metric]
			if !has {
				r.figure = fmt.Sprintf("no %s in its output", f.Metric)
				break
			}
			r.figure = f.format(v, m, sub)
			r.met = f.verdict(v, f.Target)
			if f.Busy != "" {
				// The quiet level is the machine as it was: say how busy.
				if pct, ok := m[busyMetric]; ok {
					r.figure += fmt.Sprintf(" (machine %s %% busy)", num(pct))
				}
				busy, met := runs.busy(f)
				r.figure += "; " + busy
				switch {
				case f.QuietOnly && r.met != "":
					r.met += " quiet"
				case !f.NoTarget && !f.QuietOnly:
					r.met = bothVerdicts(r.met, met)
				}
			}
			if withLoad && len(runs.load) > 0 {
				r.figure += "; " + strings.Join(runs.load, ", ")
			}
			r.ratio = f.ratio(v, m)
		case before[f.Name] != nil:
			old := before[f.Name]
			r.figure, r.met, r.ratio = old[0], old[2], old[4]
		case runs.skippedWhy(f) != "":
			r.figure = "skipped: " + runs.skippedWhy(f)
		case f.NotInBench != "":
			r.figure = "not in make bench: " + f.NotInBench
		default:
			r.figure = "not measured yet"
		}
		out = append(out, r)
	}
	return out
}

// find is f's result; a Bench ending in "/*" takes the first
// sub-benchmark there is, and says which (sub).
func (r results) find(f figure) (m result, sub string, ok bool) {
	if prefix, wild := strings.CutSuffix(f.Bench, "/*"); wild {
		for k, v := range r.metrics {
			if after, found := strings.CutPrefix(k, key(f.Pkg, prefix)+"/"); found {
				return v, after, true
			}
		}
		return nil, "", false
	}
	m, ok = r.metrics[key(f.Pkg, f.Bench)]
	return m, "", ok
}

// busy is the figure f measured with both cores kept busy, as the row
// shows it after the quiet one, and its verdict ("" when it has none).
func (r results) busy(f figure) (figure, verdict string) {
	const with = "with both cores kept busy"
	m, ok := r.metrics[key(f.Pkg, f.Busy)]
	if !ok {
		return with + ": not measured in this run", ""
	}
	v, has := m[f.Metric]
	if !has {
		return with + ": no " + f.Metric + " in its output", ""
	}
	figure = with
	if pct, ok := m[busyMetric]; ok {
		figure += fmt.Sprintf(" (machine %s %% busy)", num(pct))
	}
	return figure + " " + f.format(v, m, ""), f.verdict(v, f.busyTarget())
}

// busyMetric is the share of the machine's CPU time spent busy while a
// benchmark measured (test/busy), in percent.
const busyMetric = "machine-busy-%"

// bothVerdicts is a row's verdict from its quiet and busy figures'.
func bothVerdicts(quiet, busy string) string {
	switch {
	case busy == "":
		return quiet + " quiet; busy not measured"
	case quiet == busy && quiet == "met":
		return "met, quiet and busy"
	case quiet == busy:
		return quiet + ", quiet and busy"
	case quiet == "met":
		return "met quiet; " + busy + " busy"
	}
	return "met busy; " + quiet + " quiet"
}

func (r results) skippedWhy(f figure) string {
	for k, why := range r.skipped {
		if b := strings.TrimSuffix(f.Bench, "/*"); k == key(f.Pkg, b) || strings.HasPrefix(key(f.Pkg, b), k+"/") {
			return why
		}
	}
	return ""
}

func (f figure) scale() float64 {
	if f.Scale == 0 {
		return 1
	}
	return f.Scale
}

func (f figure) format(v float64, m result, sub string) string {
	s := num(v*f.scale()) + " " + f.Unit
	lo, hasLo := m[f.Min]
	hi, hasHi := m[f.Max]
	if f.Min != "" && hasLo && hasHi {
		s += fmt.Sprintf(" (%s to %s)", num(lo*f.scale()), num(hi*f.scale()))
	}
	if sub != "" {
		s += ", " + sub
	}
	return s
}

func (f figure) targetText() string {
	if f.NoTarget {
		return "none"
	}
	s := f.bound(f.Target)
	switch {
	case f.Busy != "" && f.QuietOnly:
		s += " quiet"
	case f.Busy != "" && f.busyTarget() != f.Target:
		s += " quiet, " + f.bound(f.busyTarget()) + " busy"
	case f.Busy != "":
		s += ", quiet and busy"
	}
	return s + f.TargetAlso
}

func (f figure) bound(target float64) string {
	if f.AtLeast {
		return ">= " + num(target) + " " + f.Unit
	}
	return "<= " + num(target) + " " + f.Unit
}

func (f figure) busyTarget() float64 {
	if f.BusyTarget != 0 {
		return f.BusyTarget
	}
	return f.Target
}

func (f figure) verdict(v, target float64) string {
	v *= f.scale()
	switch {
	case f.NoTarget:
		return ""
	case f.AtLeast && v >= target, !f.AtLeast && v <= target:
		return "met"
	}
	return "**not met**"
}

// ratio is the figure over the anchor's, when the anchor has one.
func (f figure) ratio(v float64, m result) string {
	anchor := f.AnchorValue
	if f.AnchorMetric != "" {
		anchor = m[f.AnchorMetric] * f.scale()
	}
	if anchor == 0 {
		return ""
	}
	return num(v*f.scale()/anchor) + "×"
}

// num prints a figure with three significant digits at most.
func num(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	digits := max(0, 2-int(math.Floor(math.Log10(math.Abs(v)))))
	s := strconv.FormatFloat(v, 'f', digits, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

const header = "| benchmark | figure | target | met | anchor | figure / anchor |\n| --- | --- | --- | --- | --- | --- |\n"

func render(rows []row) string {
	var b strings.Builder
	b.WriteString(header)
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.name, cell(r.figure), cell(r.target), r.met, cell(r.anchor), r.ratio)
	}
	return b.String()
}

// cell keeps a table cell one cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

const (
	beginMarker = "<!-- benchreport: begin -->"
	endMarker   = "<!-- benchreport: end -->"
)

var errNoMarkers = errors.New("no " + beginMarker + " ... " + endMarker + " section")

// section is the text between the markers.
func section(doc string) (start, end int, err error) {
	start = strings.Index(doc, beginMarker)
	end = strings.Index(doc, endMarker)
	if start < 0 || end < start {
		return 0, 0, errNoMarkers
	}
	return start + len(beginMarker), end, nil
}

// writtenRows are the rows of the table written before, by name: figure,
// target, verdict, anchor, ratio.
func writtenRows(doc string) (map[string][]string, error) {
	start, end, err := section(doc)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, line := range strings.Split(doc[start:end], "\n") {
		if !strings.HasPrefix(line, "| [") {
			continue
		}
		cells := splitCells(line)
		if len(cells) != 6 {
			return nil, fmt.Errorf("row %q: %d cells, want 6", line, len(cells))
		}
		out[cells[0]] = cells[1:]
	}
	return out, nil
}

// splitCells splits a table row at the bars that are not escaped.
func splitCells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteString(`\|`)
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

func replaceSection(doc, table string) (string, error) {
	start, end, err := section(doc)
	if err != nil {
		return "", err
	}
	return doc[:start] + "\n" + table + doc[end:], nil
}
