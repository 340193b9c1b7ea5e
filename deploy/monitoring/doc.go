// Package monitoring holds what an operator loads into Prometheus and
// Grafana to watch Flotilla's agents: alerts.yaml (alert rules, with
// their promtool unit tests in alerts_test.yaml) and dashboard.json (a
// Grafana dashboard). Its tests check both against the metrics the agent
// registers; docs/operations.md says how to install them.
package monitoring
