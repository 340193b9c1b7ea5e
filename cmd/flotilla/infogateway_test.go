package main

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDescribeGateway(t *testing.T) {
	now := time.Date(2026, 11, 29, 15, 43, 1, 0, time.UTC)
	since := metav1.NewMicroTime(now.Add(-3 * time.Minute))
	renewed := metav1.NewMicroTime(now.Add(-time.Second))
	for _, tc := range []struct {
		name string
		g    gatewayInfo
		want string
	}{
		{"one replica", gatewayInfo{Node: "gw", Pod: "flotilla-agent-x"}, "node gw (pod flotilla-agent-x), one replica"},
		{"one replica, none labelled", gatewayInfo{}, "no agent pod labelled active"},
		{"elected", gatewayInfo{Elected: true, Node: "gw2", Pod: "flotilla-agent-y", Since: &since, Renewed: &renewed, Changes: 2},
			"active on node gw2 (pod flotilla-agent-y) since 2026-11-29T15:40:01Z (3m ago), Lease renewed 1s ago, changed hands 2 times"},
		{"elected, nobody holds it", gatewayInfo{Elected: true}, "no replica holds the Lease flotilla-agent"},
	} {
		if got := describeGateway(tc.g, now); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
