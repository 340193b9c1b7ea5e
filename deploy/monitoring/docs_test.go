package monitoring

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	promql "github.com/prometheus/prometheus/promql/parser"
)

// promqlBlock is a PromQL example of the docs.
var promqlBlock = regexp.MustCompile("(?s)```promql\n(.*?)```")

// The PromQL examples of docs/operations.md parse and name only metrics
// and labels the agent serves; the one that names both clusters by
// joining flotilla_cluster_info gives, evaluated by Prometheus on a
// peer's series and the agent's, the peer's ID and name beside the local
// cluster's name.
func TestDocumentedQueries(t *testing.T) {
	known := registeredMetrics(t)
	blocks := promqlBlock.FindAllStringSubmatch(readFile(t, "../../docs/operations.md"), -1)
	join := ""
	for _, b := range blocks {
		q := strings.TrimSpace(b[1])
		expr, err := promql.ParseExpr(q)
		if err != nil {
			t.Errorf("docs/operations.md: %q does not parse: %v", q, err)
			continue
		}
		for _, p := range unknownNames(expr, known, map[string]bool{}) {
			t.Errorf("docs/operations.md: %s (in %s)", p, q)
		}
		if strings.Contains(q, "group_left (local_cluster) flotilla_cluster_info") {
			join = q
		}
	}
	if join == "" {
		t.Fatalf("docs/operations.md has no example joining flotilla_cluster_info (of %d)", len(blocks))
	}

	dir := t.TempDir()
	rules := fmt.Sprintf("groups:\n- name: docs\n  rules:\n  - record: documented_join\n    expr: %s\n", strconv.Quote(join))
	tests := `rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
  - series: 'flotilla_tunnel_peer_last_handshake_timestamp_seconds{instance="gw-a:9470", job="flotilla-agent", peer="cbeta", peer_name="beta"}'
    values: '0x5'
  - series: 'flotilla_cluster_info{instance="gw-a:9470", job="flotilla-agent", local_cluster="alpha", local_cluster_id="calpha"}'
    values: '1x5'
  promql_expr_test:
  - expr: documented_join
    eval_time: 2m
    exp_samples:
    - labels: 'documented_join{instance="gw-a:9470", job="flotilla-agent", local_cluster="alpha", peer="cbeta", peer_name="beta"}'
      value: 120
`
	for name, text := range map[string]string{"rules.yaml": rules, "tests.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runPromtool(t, "test", "rules", filepath.Join(dir, "tests.yaml"))
}
