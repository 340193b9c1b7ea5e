package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/tunnel"
)

// errLostLease stops an active replica that lost the Lease: it restarts
// as the standby.
var errLostLease = errors.New("lost the Lease " + ha.LeaseName + " to another replica; stopping to restart as the standby")

// startElected campaigns for the Lease (--leader-elect) and starts the
// components only once this replica holds it: until then it is the
// standby, serving health and metrics, not ready, its data path absent.
// A replica that had been active and is fenced (the Lease another's or
// expired, or released as it stops) has its data path removed once its
// components stopped (Run, removeFencedDataPath).
func (a *Agent) startElected(start func(context.Context, *components) error) func(context.Context, *components) error {
	return func(ctx context.Context, comps *components) error {
		e := &ha.Elector{
			Kube: a.kube, Namespace: a.agentNamespace(), Identity: ha.NewIdentity(a.cfg.NodeName),
			Log:           a.log.With("component", "leader election"),
			LeaseDuration: a.cfg.LeaseDuration, RenewDeadline: a.cfg.RenewDeadline, RetryPeriod: a.cfg.RetryPeriod,
		}
		a.registry.MustRegister(e.Collectors()...)
		active := make(chan struct{})
		comps.Go("leader election", func(ctx context.Context) error {
			err := e.Run(ctx, func(context.Context) { close(active) }, func() { a.fenced.Store(true) })
			if err == nil && ctx.Err() == nil {
				err = errLostLease
			}
			return err
		})
		a.log.Info("standby: waiting for the Lease", "lease", a.agentNamespace()+"/"+ha.LeaseName, "identity", e.Identity)
		select {
		case <-active:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return start(ctx, comps)
	}
}

// removeFencedDataPath removes the WireGuard link, its routes and our
// nftables table once a fenced replica's components have stopped: the
// active replica runs the data path now.
func (a *Agent) removeFencedDataPath() error {
	if !a.fenced.Load() || a.traced.Load() == nil {
		return nil // not fenced, or fenced before it brought a data path up
	}
	if err := tunnel.Cleanup(tunnel.Config{Interface: a.cfg.WireGuardInterface}); err != nil {
		return fmt.Errorf("remove the data path of a fenced replica: %w", err)
	}
	a.log.Info("data path removed: another replica is active", "interface", a.cfg.WireGuardInterface)
	return nil
}
