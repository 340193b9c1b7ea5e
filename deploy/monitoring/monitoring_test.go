package monitoring

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/test/harness"
)

// promtool finds Prometheus's promtool; without it the test is skipped,
// except under CI, where it fails (harness.Require).
func promtool(t *testing.T) string {
	t.Helper()
	harness.Require(t, harness.Promtool)
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// rules is the part of a Prometheus rules file the tests read.
type rules struct {
	Groups []struct {
		Rules []struct {
			Alert  string `json:"alert"`
			Record string `json:"record"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) rules {
	t.Helper()
	raw, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var r rules
	if err := yaml.Unmarshal(raw, &r); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	return r
}

// The rules load in Prometheus, and promtool's unit tests fire each alert
// on the series that should fire it, with its labels and annotations.
func TestAlertRules(t *testing.T) {
	runPromtool(t, "check", "rules", "alerts.yaml")
	runPromtool(t, "test", "rules", "alerts_test.yaml")

	// Every alert has a unit test in which it fires.
	raw, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string            `json:"alertname"`
				ExpAlerts []json.RawMessage `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatalf("alerts_test.yaml: %v", err)
	}
	fired := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			fired[a.Alertname] = fired[a.Alertname] || len(a.ExpAlerts) > 0
		}
	}
	n := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fired[r.Alert] {
				t.Errorf("alert %s fires in no test of alerts_test.yaml", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Error("alerts.yaml has no alerts")
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// panels lists the dashboard's panels, those in collapsed rows included,
// rows left out.
func (d dashboard) panels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// The dashboard parses, every panel has a query on the chosen data source
// and agents, and every query is valid PromQL.
func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard title %q, uid %q: want both", d.Title, d.UID)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] || !vars["instance"] {
		t.Errorf("dashboard variables %v: want datasource and instance", vars)
	}
	ids := map[int]string{}
	var exprs []string
	panels := d.panels()
	if len(panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range panels {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", p.Title, other, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %+v, want the dashboard's ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			if !strings.Contains(tg.Expr, `instance=~"$instance"`) {
				t.Errorf("panel %q: query %q ignores the Agent selector", p.Title, tg.Expr)
			}
			exprs = append(exprs, tg.Expr)
		}
	}

	// promtool checks PromQL in rules files: one recording rule per query,
	// with the variables as Grafana fills them in.
	var b strings.Builder
	b.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for i, e := range exprs {
		e = strings.ReplaceAll(e, "$instance", ".*")
		fmt.Fprintf(&b, "  - record: dashboard_query_%d\n    expr: %s\n", i, strconv.Quote(e))
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "check", "rules", path)
}

// metricName matches the names of our metrics in PromQL; the agent's
// others (go_*, process_*) and Prometheus's up are checked by name.
var metricName = regexp.MustCompile(`\b(flotilla_[a-z0-9_]+|go_[a-z0-9_]+|process_[a-z0-9_]+|up)\b`)

// selector matches a metric with a label selector, and matcher each label
// it names.
var (
	selector = regexp.MustCompile(`\b(flotilla_[a-z0-9_]+)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// Labels every series has once scraped; le is a histogram bucket's.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// Every metric the rules and the dashboard query is one the agent
// serves, with the labels they select on: a query of a renamed or
// misspelt metric or label returns nothing, and an alert on it never
// fires.
func TestQueriedMetricsExist(t *testing.T) {
	known := registeredMetrics(t)
	var queries []string // "where: expr"
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			queries = append(queries, "alert "+r.Alert+": "+r.Expr)
		}
	}
	for _, p := range readDashboard(t).panels() {
		for _, tg := range p.Targets {
			queries = append(queries, "panel "+strconv.Quote(p.Title)+": "+tg.Expr)
		}
	}
	used := map[string]bool{}
	for _, q := range queries {
		for _, m := range metricName.FindAllString(q, -1) {
			used[m] = true
			if _, ok := known[m]; !ok {
				t.Errorf("%s is not a metric the agent serves (in %s)", m, q)
			}
		}
		for _, sel := range selector.FindAllStringSubmatch(q, -1) {
			labels, ok := known[sel[1]]
			if !ok || labels == nil {
				continue // unknown metric (reported above) or labels not literal
			}
			for _, l := range matcher.FindAllStringSubmatch(sel[2], -1) {
				if !labels[l[1]] && !scrapeLabels[l[1]] {
					t.Errorf("%s has no label %s (it has %v; in %s)", sel[1], l[1], slices.Sorted(maps.Keys(labels)), q)
				}
			}
		}
	}
	if len(used) < 10 {
		t.Errorf("the rules and the dashboard use %d metrics; the regexp misses some", len(used))
	}
}

// registeredMetrics are the names the agent serves, each with its labels
// (nil when the source does not spell them out): what its registry holds
// from the start (build info, Go and process collectors), and what its
// components register, read from their source: most register only once
// running against a cluster, and series with labels appear only once
// observed, so a scrape of a fresh agent would miss them.
func registeredMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	// Prometheus adds up to every scraped target.
	known := map[string]map[string]bool{"up": {}}
	families, err := agent.NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		known[f.GetName()] = labels
	}
	fromSource := 0
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "../.." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for name, m := range metricsDeclared(f) {
			fromSource++
			known[name] = m.labels
			for _, suffix := range seriesSuffixes[m.kind] {
				labels := m.labels
				if suffix == "_bucket" && labels != nil {
					labels = maps.Clone(labels)
					labels["le"] = true
				}
				known[name+suffix] = labels
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fromSource < 50 {
		t.Fatalf("found %d metrics in the source; the parser misses how they are declared", fromSource)
	}
	return known
}

// seriesSuffixes are the series a histogram or summary is exported as.
var seriesSuffixes = map[string][]string{
	"HistogramOpts": {"_bucket", "_sum", "_count"},
	"SummaryOpts":   {"_sum", "_count"},
}

// declared is a metric as its source declares it.
type declared struct {
	kind   string          // the Opts type, or "Desc" for a custom collector's
	labels map[string]bool // variable and constant labels; nil if not literal
}

// metricsDeclared finds prometheus.XxxOpts{Name: "..."} (with the labels
// of the NewXxxVec it is given to) and prometheus.NewDesc("...", help,
// labels, constLabels) in f.
func metricsDeclared(f *ast.File) map[string]declared {
	out := map[string]declared{}
	prometheusName := func(e ast.Expr) (string, bool) {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		pkg, ok := sel.X.(*ast.Ident)
		return sel.Sel.Name, ok && pkg.Name == "prometheus"
	}
	str := func(e ast.Expr) (string, bool) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		return s, err == nil
	}
	// addLabels adds the labels of a []string{...} or a
	// prometheus.Labels{...} literal (nil adds none); false if e is
	// something else.
	addLabels := func(to map[string]bool, e ast.Expr) bool {
		if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
			return true
		}
		lit, ok := e.(*ast.CompositeLit)
		if !ok {
			return false
		}
		for _, el := range lit.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				el = kv.Key
			}
			s, ok := str(el)
			if !ok {
				return false
			}
			to[s] = true
		}
		return true
	}
	// opts reads an Opts literal: its name, kind and constant labels.
	opts := func(e ast.Expr) (string, declared, bool) {
		lit, ok := e.(*ast.CompositeLit)
		if !ok {
			return "", declared{}, false
		}
		kind, ok := prometheusName(lit.Type)
		if !ok || !strings.HasSuffix(kind, "Opts") {
			return "", declared{}, false
		}
		d := declared{kind: kind, labels: map[string]bool{}}
		name := ""
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			switch key, _ := kv.Key.(*ast.Ident); {
			case key == nil:
			case key.Name == "Name":
				name, _ = str(kv.Value)
			case key.Name == "ConstLabels":
				if !addLabels(d.labels, kv.Value) {
					d.labels = nil
				}
			}
		}
		return name, d, name != ""
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			// Opts given to a constructor without labels; a Vec's are
			// completed below, where the call is seen first.
			if name, d, ok := opts(n); ok {
				if _, seen := out[name]; !seen {
					out[name] = d
				}
			}
		case *ast.CallExpr:
			fn, ok := prometheusName(n.Fun)
			switch {
			case !ok:
			case fn == "NewDesc" && len(n.Args) == 4:
				name, ok := str(n.Args[0])
				if !ok {
					return true
				}
				d := declared{kind: "Desc", labels: map[string]bool{}}
				if !addLabels(d.labels, n.Args[2]) || !addLabels(d.labels, n.Args[3]) {
					d.labels = nil
				}
				out[name] = d
			case strings.HasSuffix(fn, "Vec") && len(n.Args) == 2:
				name, d, ok := opts(n.Args[0])
				if !ok {
					return true
				}
				if d.labels != nil && !addLabels(d.labels, n.Args[1]) {
					d.labels = nil
				}
				out[name] = d
			}
		}
		return true
	})
	return out
}
