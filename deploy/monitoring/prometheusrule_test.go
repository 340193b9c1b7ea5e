package monitoring

import (
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "write prometheusrule.yaml from alerts.yaml")

// prometheusRuleHead is prometheusrule.yaml up to its spec; alerts.yaml's
// groups follow, indented under spec.
const prometheusRuleHead = `# Prometheus Operator: the alert rules of alerts.yaml as a PrometheusRule.
# Written from alerts.yaml by
#   go test ./deploy/monitoring -run TestPrometheusRuleHoldsTheAlerts -update
# (the test fails when the two differ). Prometheus selects rules by its
# ruleSelector: add its label to metadata.labels if it selects by one.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: flotilla
  namespace: flotilla-system
  labels:
    app.kubernetes.io/name: flotilla
    app.kubernetes.io/managed-by: flotilla
spec:
`

// prometheusRule is alerts.yaml's groups as a PrometheusRule, comments
// kept.
func prometheusRule(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(prometheusRuleHead)
	started := false
	for line := range strings.Lines(readFile(t, "alerts.yaml")) {
		if !started && !strings.HasPrefix(line, "groups:") {
			continue // the file's own header
		}
		started = true
		if strings.TrimSpace(line) == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString("  " + line)
	}
	return b.String()
}

// The PrometheusRule holds exactly alerts.yaml's rules, so that the rules
// promtool tests are the ones the operator loads.
func TestPrometheusRuleHoldsTheAlerts(t *testing.T) {
	want := prometheusRule(t)
	if *update {
		if err := os.WriteFile("prometheusrule.yaml", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var rule struct {
		Kind string         `json:"kind"`
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "prometheusrule.yaml")), &rule); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	var alerts map[string]any
	if err := yaml.Unmarshal([]byte(readFile(t, "alerts.yaml")), &alerts); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	if rule.Kind != "PrometheusRule" || !reflect.DeepEqual(rule.Spec, alerts) {
		t.Errorf("prometheusrule.yaml (%s) does not hold alerts.yaml's groups; write it again with go test ./deploy/monitoring -run TestPrometheusRuleHoldsTheAlerts -update", rule.Kind)
	}
	if readFile(t, "prometheusrule.yaml") != want {
		t.Error("prometheusrule.yaml is not as written from alerts.yaml; write it again with -update")
	}
}
