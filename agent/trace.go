package agent

import (
	"context"
	"net/http"
	"time"

	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/observe/trace/live"
)

// traceHandler serves /trace on the metrics port: the gateway's routing
// state and its tunnel as the kernel holds them now, for flotilla trace.
// Public keys only; a part that cannot be read is named in errors and the
// rest is served.
func (a *Agent) traceHandler() http.Handler {
	return live.Handler(func(context.Context) (trace.NodeReport, error) {
		rep := trace.NodeReport{Node: a.cfg.NodeName}
		k, err := live.ReadKernel(live.Config{})
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		}
		rep.Kernel = k
		tun := a.traced.Load()
		if tun == nil {
			rep.Errors = append(rep.Errors, "the tunnel has not started yet")
			return rep, nil
		}
		in, err := tun.Inspect()
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			return rep, nil
		}
		sets, err := tun.PolicySets()
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		}
		rep.Tunnel = live.TunnelOf(in, sets, time.Now())
		return rep, nil
	}, a.log.With("component", "trace"))
}
