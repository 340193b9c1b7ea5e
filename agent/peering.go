package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
)

// startPeering runs the negotiation engine and returns once it has
// restored its state and applied the data path it found in the ledger.
func (a *Agent) startPeering(ctx context.Context, comps *components, st state, announced []netip.Prefix, endpoint netip.AddrPort, tun peering.Dataplane, disc *discovery.Discovery) (*peering.Engine, *offloading, error) {
	objects, err := peerapi.New(a.restCfg, a.log.With("component", "peers"))
	if err != nil {
		return nil, nil, err
	}
	var engine atomic.Pointer[peering.Engine]
	off, err := a.newOffloading(st, objects, &engine)
	if err != nil {
		return nil, nil, err
	}
	if off.services, err = a.newServices(st, disc, off.shared); err != nil {
		return nil, nil, err
	}
	eng, err := peering.New(peering.Config{
		Identity: st.id, Name: a.cfg.ClusterName, Labels: a.cfg.ClusterLabels, Policy: a.cfg.Peering,
		Networks: announced, Endpoint: endpoint,
		Ledger: st.ledger, Dataplane: a.onAgentClock(tun), Transport: disc, Publisher: off, Grants: off.credentials,
		UnreachableGrace: a.cfg.UnreachableGrace, Now: a.now,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, nil, err
	}
	engine.Store(eng)
	stopped := make(chan struct{})
	comps.Go("peering engine", func(ctx context.Context) error {
		defer close(stopped)
		return eng.Run(ctx)
	})
	a.ready.add("peering", func() error {
		select {
		case <-stopped:
			return errors.New("peering engine stopped")
		default:
			return nil
		}
	})
	select {
	case <-eng.Ready():
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("peering engine not ready: %w", context.Cause(ctx))
	}
	return eng, off, nil
}

// watchPeers reports the Peer objects' specs to the engine and writes the
// states it publishes, as a component, and returns once the informer has
// synced: the engine then knows every admin's decision before discovery
// reports the first member.
func (a *Agent) watchPeers(ctx context.Context, comps *components, objects *peerapi.Objects, eng *peering.Engine) error {
	comps.Go("Peer objects", func(ctx context.Context) error {
		return objects.Run(ctx, eng)
	})
	select {
	case <-objects.Synced():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("Peer informer not synced: %w", context.Cause(ctx))
	}
}
