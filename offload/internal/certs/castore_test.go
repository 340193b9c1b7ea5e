package certs

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The agent registers both servers' stores in one registry: one metric,
// told apart by component.
func TestCAStoresShareTheExpiryMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, component := range []string{"placement_webhook", "kubelet_api"} {
		if err := reg.Register(NewCAStore(CAStoreConfig{Name: component, Component: component})); err != nil {
			t.Fatalf("register the %s store: %v", component, err)
		}
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}
