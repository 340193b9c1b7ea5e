package agent

import (
	"fmt"
	"os"
	"time"

	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/tunnel"
)

// clockSkewEnv, when set (a Go duration: "-5m", "+3m"), shifts the clock
// the agent stamps its own state with: discovery's record serials, the
// peering statements' generations and the ledger's times. It is hidden,
// for the fault campaign (docs/reliability.md): Go reads the clock through
// the vDSO, so neither libfaketime nor a time namespace can skew one
// process's wall clock. WireGuard's handshake stamps and the Kubernetes
// clients keep the host's clock.
const clockSkewEnv = "FLOTILLA_CLOCK_SKEW"

// clockFromEnv is the agent's clock: the host's, shifted by
// $FLOTILLA_CLOCK_SKEW when set. The only place that reads it.
func clockFromEnv() (func() time.Time, time.Duration, error) {
	v := os.Getenv(clockSkewEnv)
	if v == "" {
		return time.Now, 0, nil
	}
	skew, err := time.ParseDuration(v)
	if err != nil {
		return nil, 0, fmt.Errorf("$%s: %w (want a duration such as -5m)", clockSkewEnv, err)
	}
	return func() time.Time { return time.Now().Add(skew) }, skew, nil
}

// onAgentClock gives the engine the tunnel's handshake times on the
// agent's clock, which it compares them with: the tunnel stamps them with
// the host's. Without a skew both are the host's clock.
func (a *Agent) onAgentClock(d peering.Dataplane) peering.Dataplane {
	if a.skew == 0 {
		return d
	}
	return skewedDataplane{Dataplane: d, skew: a.skew}
}

type skewedDataplane struct {
	peering.Dataplane
	skew time.Duration
}

func (d skewedDataplane) Status() ([]tunnel.PeerStatus, error) {
	st, err := d.Dataplane.Status()
	for i := range st {
		if !st[i].LastHandshake.IsZero() {
			st[i].LastHandshake = st[i].LastHandshake.Add(d.skew)
		}
	}
	return st, err
}
