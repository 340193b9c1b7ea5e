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
	"slices"
	"strconv"
	"strings"
	"testing"

	promql "github.com/prometheus/prometheus/promql/parser"
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

// Labels every series has once scraped (Prometheus Operator adds
// namespace, pod and container to a PodMonitor's).
var scrapeLabels = map[string]bool{"instance": true, "job": true, "namespace": true, "pod": true, "container": true}

// query is a PromQL expression of the rules or the dashboard, with where
// it is.
type query struct{ where, expr string }

// queries are every alert's and recording rule's expression and every
// dashboard query, the dashboard's variables filled in as Grafana does.
func queries(t *testing.T) []query {
	t.Helper()
	var out []query
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			out = append(out, query{"alert " + r.Alert + r.Record, r.Expr})
		}
	}
	for _, p := range readDashboard(t).panels() {
		for _, tg := range p.Targets {
			out = append(out, query{"panel " + strconv.Quote(p.Title), strings.ReplaceAll(tg.Expr, "$instance", ".*")})
		}
	}
	return out
}

// Every expression parses with Prometheus's own PromQL parser and names
// only metrics the agent or the fabric serves, with labels they have: in
// its selectors, and in its aggregations' and matchings' label lists. A
// query of a renamed or misspelt metric or label returns nothing, and an
// alert on it never fires.
func TestQueriedMetricsExist(t *testing.T) {
	known := registeredMetrics(t)
	used := map[string]bool{}
	for _, q := range queries(t) {
		expr, err := promql.ParseExpr(q.expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		for _, p := range unknownNames(expr, known, used) {
			t.Errorf("%s: %s (in %s)", q.where, p, q.expr)
		}
	}
	if len(used) < 10 {
		t.Errorf("the rules and the dashboard use %d metrics; the walk misses some", len(used))
	}
}

// The check above fails on what it should: a misspelt metric, a label
// no metric has, in a selector, a by clause or a matching.
func TestQueriedMetricsExistRefuses(t *testing.T) {
	known := registeredMetrics(t)
	for _, tc := range []struct{ expr, want string }{
		{`flotilla_peer_phases == 1`, "flotilla_peer_phases is not a metric"},
		{`flotilla_peer_phase{clusterr="a"} == 1`, "has no label clusterr"},
		{`sum by (instance, peer_nam) (flotilla_virtual_node_ready)`, "label peer_nam"},
		{`flotilla_peer_phase * on (instance) group_left (local_clustr) flotilla_cluster_info`, "label local_clustr"},
		{`rate(flotilla_reflection_errors_total{reason="quota"}[5m])`, ""},
		{`sum by (peer_name, le) (rate(flotilla_reflection_lag_seconds_bucket[5m]))`, ""},
		{`sum by (consumer_name, cluster_name) (rate(flotilla_hosted_endpoints_translated_total[5m]))`, ""},
		{`sum by (consumer_name, reason) (rate(flotilla_hosted_endpoints_dropped_total[5m]))`, ""},
		{`sum by (cluster_name) (rate(flotilla_hosted_endpoints_dropped_total[5m]))`, "label cluster_name"},
	} {
		expr, err := promql.ParseExpr(tc.expr)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		got := strings.Join(unknownNames(expr, known, map[string]bool{}), "; ")
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// unknownNames says what of expr names no metric or label of known; used
// collects the metrics it selects.
func unknownNames(expr promql.Expr, known map[string]map[string]bool, used map[string]bool) []string {
	var problems []string
	// labelsOf are the labels the series of node's selectors may carry;
	// nil when one is not spelt out in the source.
	labelsOf := func(node promql.Node) map[string]bool {
		out := maps.Clone(scrapeLabels)
		complete := true
		promql.Inspect(node, func(n promql.Node, _ []promql.Node) error {
			if vs, ok := n.(*promql.VectorSelector); ok {
				labels := known[vs.Name]
				if labels == nil {
					complete = false
				}
				maps.Copy(out, labels)
			}
			return nil
		})
		if !complete {
			return nil
		}
		return out
	}
	check := func(what string, names []string, node promql.Node) {
		have := labelsOf(node)
		for _, l := range names {
			if have != nil && !have[l] {
				problems = append(problems, fmt.Sprintf("%s names label %s, which none of its metrics has (%v)", what, l, slices.Sorted(maps.Keys(have))))
			}
		}
	}
	promql.Inspect(expr, func(n promql.Node, _ []promql.Node) error {
		switch n := n.(type) {
		case *promql.VectorSelector:
			used[n.Name] = true
			labels, ok := known[n.Name]
			if !ok {
				problems = append(problems, n.Name+" is not a metric the agent or the fabric serves")
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" && labels != nil && !labels[m.Name] && !scrapeLabels[m.Name] {
					problems = append(problems, fmt.Sprintf("%s has no label %s (it has %v)", n.Name, m.Name, slices.Sorted(maps.Keys(labels))))
				}
			}
		case *promql.AggregateExpr:
			check(n.Op.String(), n.Grouping, n.Expr)
		case *promql.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				if vm.On {
					check("on", vm.MatchingLabels, n)
				}
				check("group_left/right", vm.Include, n)
			}
		}
		return nil
	})
	return problems
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
	// The agent adds a peer's name beside each label that holds its ID
	// when it serves a series (peer_name beside peer, ...).
	for _, labels := range known {
		for id, name := range agent.NameLabels() {
			if labels[id] {
				labels[name] = true
			}
		}
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
