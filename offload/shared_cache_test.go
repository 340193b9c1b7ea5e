package offload

import (
	"testing"

	"k8s.io/client-go/rest"
)

// startSharedCache is the agent's SharedCache over cfg's API server, run
// until the test ends: the components a test starts and restarts read
// through it as in the agent, where it outlives them.
func startSharedCache(tb testing.TB, cfg *rest.Config, peers PeerCache) *SharedCache {
	tb.Helper()
	c, err := NewSharedCache(cfg, peers)
	if err != nil {
		tb.Fatal(err)
	}
	runUntilCleanup(tb, "the shared cache", c.Start)
	return c
}
