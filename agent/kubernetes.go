package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// apiServerProbeInterval is how often the agent checks that its API server
// answers; /readyz reports the last result.
const apiServerProbeInterval = 5 * time.Second

// watchAPIServer probes the local API server's /readyz until ctx ends and
// returns a readiness check reporting the last probe.
func (a *Agent) watchAPIServer(ctx context.Context) func() error {
	var mu sync.Mutex
	last := errors.New("not probed yet")
	first := true
	up := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flotilla_apiserver_up",
		Help: "1 when the local Kubernetes API server answered the last probe.",
	})
	a.registry.MustRegister(up)
	probe := func() {
		pctx, cancel := context.WithTimeout(ctx, apiServerProbeInterval)
		defer cancel()
		body, err := a.kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(pctx)
		if err == nil && string(body) != "ok" {
			err = fmt.Errorf("API server /readyz: %q", body)
		}
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("API server %s: %w", a.restCfg.Host, err)
		}
		mu.Lock()
		changed := first || (last == nil) != (err == nil)
		last, first = err, false
		mu.Unlock()
		if err == nil {
			up.Set(1)
		} else {
			up.Set(0)
		}
		if changed && ctx.Err() == nil {
			if err != nil {
				a.log.Warn("API server unreachable", "err", err)
			} else {
				a.log.Info("API server reachable", "host", a.restCfg.Host)
			}
		}
	}
	go func() {
		// Probe quickly until the first success, then at the interval.
		wait := 200 * time.Millisecond
		for {
			probe()
			mu.Lock()
			if last == nil {
				wait = apiServerProbeInterval
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}()
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}
