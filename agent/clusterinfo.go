package agent

import "github.com/prometheus/client_golang/prometheus"

// clusterInfo is this cluster's name beside its ID as a metric of value
// 1: one series per agent, which a query joins on instance to name the
// local cluster (per-peer series name the peer by its ID and its name,
// peerMetrics).
func clusterInfo(name, id string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "flotilla_cluster_info",
		Help:        "This cluster: its name (local_cluster) and cluster ID (local_cluster_id); always 1.",
		ConstLabels: prometheus.Labels{"local_cluster": name, "local_cluster_id": id},
	}, func() float64 { return 1 })
}
