package peerapi

import (
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// The client that writes statuses allows the writer's own rate, whatever
// the agent's config says: client-go's default would throttle a start-up's
// writes to 5 requests a second.
func TestWriteClientAllowsTheWritersRate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  *rest.Config
	}{
		{"client-go's defaults", &rest.Config{Host: "https://127.0.0.1:6443"}},
		{"a lower rate", &rest.Config{Host: "https://127.0.0.1:6443", QPS: 1, Burst: 2}},
		{"a limiter of its own", &rest.Config{Host: "https://127.0.0.1:6443", RateLimiter: flowcontrol.NewTokenBucketRateLimiter(1, 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := *tc.cfg
			got := writeClientConfig(tc.cfg)
			if got.RateLimiter != nil || got.QPS < writeRate*requestsPerWrite || got.Burst < writeBurst*requestsPerWrite {
				t.Errorf("QPS %v, burst %d, limiter %v: want at least %d and %d, no limiter of its own", got.QPS, got.Burst, got.RateLimiter, writeRate*requestsPerWrite, writeBurst*requestsPerWrite)
			}
			if tc.cfg.QPS != before.QPS || tc.cfg.Burst != before.Burst || tc.cfg.RateLimiter != before.RateLimiter {
				t.Errorf("the agent's config changed: %+v", tc.cfg)
			}
		})
	}
}
