package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

func kubectl(cp *harness.ControlPlane, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// deploy/monitoring applies, as docs/operations.md says to, to a real API
// server holding Prometheus Operator's own CRDs (from its release, not
// written here), with strict field validation: a misspelt field or a
// value their schemas refuse fails here, not on a user's cluster. The
// same objects with one field misspelt are refused, once the real ones
// are in: the validation this rests on is on.
func TestMonitoringAppliesToTheOperatorsCRDs(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.PrometheusOperator)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	for _, crd := range harness.PrometheusOperatorCRDs() {
		if out, err := kubectl(cp, "apply", "--server-side", "-f", crd); err != nil {
			t.Fatalf("apply %s: %v\n%s", filepath.Base(crd), err, out)
		}
	}
	if out, err := kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/podmonitors.monitoring.coreos.com", "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com"); err != nil {
		t.Fatalf("Prometheus Operator's CRDs not Established: %v\n%s", err, out)
	}
	if out, err := kubectl(cp, "apply", "--server-side", "-f", "../namespace.yaml"); err != nil {
		t.Fatalf("apply deploy/namespace.yaml: %v\n%s", err, out)
	}

	out, err := kubectl(cp, "apply", "--server-side", "--validate=strict", "-k", ".")
	if err != nil {
		t.Fatalf("kubectl apply -k deploy/monitoring: %v\n%s", err, out)
	}
	t.Logf("kubectl apply -k deploy/monitoring:\n%s", out)
	for _, obj := range []string{"podmonitor/flotilla-agent", "podmonitor/flotilla-fabric", "prometheusrule/flotilla"} {
		if out, err := kubectl(cp, "-n", "flotilla-system", "get", obj, "-o", "name"); err != nil {
			t.Errorf("%s not there after the apply: %v\n%s", obj, err, out)
		}
	}

	for _, tc := range []struct{ file, from, to, want string }{
		{"podmonitor.yaml", "  podMetricsEndpoints:", "  podMetricEndpoints:", ".spec.podMetricEndpoints: field not declared in schema"},
		{"podmonitor.yaml", "    authorization:", "    authorisation:", ".spec.podMetricsEndpoints[0].authorisation: field not declared in schema"},
		{"prometheusrule.yaml", "      for: 5m", "      for: five minutes", "spec.groups[0].rules[0].for"},
		{"prometheusrule.yaml", "      annotations:", "      anotations:", `.spec.groups[name="flotilla"].rules[0].anotations: field not declared in schema`},
	} {
		t.Run(tc.file+" "+strings.TrimSpace(tc.to), func(t *testing.T) {
			raw, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(raw), tc.from) {
				t.Fatalf("%s has no %q to change", tc.file, tc.from)
			}
			bad := filepath.Join(t.TempDir(), tc.file)
			if err := os.WriteFile(bad, []byte(strings.Replace(string(raw), tc.from, tc.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := kubectl(cp, "apply", "--server-side", "--validate=strict", "-f", bad)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("apply of %s with %q: %v\n%s\nwant refused with %q", tc.file, tc.to, err, out, tc.want)
			}
		})
	}
}
