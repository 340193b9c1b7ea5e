package monitoring

import (
	"os"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The PodMonitors send a token of the account that podmonitor.yaml binds
// to deploy/rbac.yaml's flotilla-metrics-reader (which the agent's test
// TestMetricsPortAccess proves gets /metrics and nothing else), to the
// port the agent and the fabric name "metrics".
func TestPodMonitorsScrapeWithTheReadersToken(t *testing.T) {
	docs := yamlDocs(t, "podmonitor.yaml")
	var secret, account string
	var binding rbacv1.ClusterRoleBinding
	var monitors []map[string]any
	for _, d := range docs {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(d), &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "Secret":
			secret, account = head.Metadata.Name, head.Metadata.Annotations["kubernetes.io/service-account.name"]
		case "ClusterRoleBinding":
			if err := yaml.Unmarshal([]byte(d), &binding); err != nil {
				t.Fatal(err)
			}
		case "PodMonitor":
			var m map[string]any
			if err := yaml.Unmarshal([]byte(d), &m); err != nil {
				t.Fatal(err)
			}
			monitors = append(monitors, m)
		}
	}
	if binding.RoleRef.Name != "flotilla-metrics-reader" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != account {
		t.Errorf("binding %+v: want flotilla-metrics-reader for the account %q of the Secret", binding, account)
	}
	if !strings.Contains(readFile(t, "../rbac.yaml"), "name: flotilla-metrics-reader") {
		t.Error("deploy/rbac.yaml has no flotilla-metrics-reader")
	}
	if len(monitors) != 2 {
		t.Fatalf("%d PodMonitors, want the agent's and the fabric's", len(monitors))
	}
	for _, m := range monitors {
		spec := m["spec"].(map[string]any)
		ep := spec["podMetricsEndpoints"].([]any)[0].(map[string]any)
		cred := ep["authorization"].(map[string]any)["credentials"].(map[string]any)
		if ep["port"] != "metrics" || cred["name"] != secret || cred["key"] != "token" {
			t.Errorf("PodMonitor %v: endpoint %v, want port metrics with the token of Secret %s", m["metadata"], ep, secret)
		}
	}
	if !strings.Contains(readFile(t, "../deployment.yaml"), "- name: metrics\n          containerPort: 9470") {
		t.Error("the agent's Deployment names no port metrics 9470")
	}
}

func yamlDocs(t *testing.T, path string) []string {
	t.Helper()
	return strings.Split(readFile(t, path), "\n---\n")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
