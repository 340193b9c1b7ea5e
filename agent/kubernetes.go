package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// apiServerProbeInterval is how often the agent checks that its API server
// answers; /readyz reports the last result.
const apiServerProbeInterval = 5 * time.Second

// apiServerProbe checks the local API server's /readyz; the agent runs it
// as a component and reports its result in /readyz.
func (a *Agent) apiServerProbe() *probe {
	up := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flotilla_apiserver_up",
		Help: "1 when the local Kubernetes API server answered the last probe.",
	})
	a.registry.MustRegister(up)
	p := newProbe(func(ctx context.Context) error {
		body, err := a.kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) != "ok" {
			err = fmt.Errorf("API server /readyz: %q", body)
		}
		if err != nil {
			return fmt.Errorf("API server %s: %w", a.restCfg.Host, err)
		}
		return nil
	}, apiServerProbeInterval, apiServerProbeInterval)
	p.untilUp = 200 * time.Millisecond
	p.changed = func(err error) {
		if err != nil {
			up.Set(0)
			a.log.Warn("API server unreachable", "err", err)
			return
		}
		up.Set(1)
		a.log.Info("API server reachable", "host", a.restCfg.Host)
	}
	return p
}
