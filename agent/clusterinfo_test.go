package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The agent's metrics name its own cluster, by name and ID, in one
// series.
func TestClusterInfoNamesTheLocalCluster(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(clusterInfo("paris", "cxy52fhngn45aolv6zwwtnjwuei"))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != "flotilla_cluster_info" || len(families[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one series of flotilla_cluster_info", families)
	}
	m := families[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["local_cluster"] != "paris" || labels["local_cluster_id"] != "cxy52fhngn45aolv6zwwtnjwuei" || len(labels) != 2 || m.GetGauge().GetValue() != 1 {
		t.Errorf("flotilla_cluster_info %v = %v, want local_cluster=paris, local_cluster_id=cxy52fhngn45aolv6zwwtnjwuei, 1", labels, m.GetGauge().GetValue())
	}
}
