package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
)

// startPeering runs the negotiation engine and returns once it has
// restored its state and applied the data path it found in the ledger.
// Its states go to the Peer writer, and to offloading once made, through
// relay.
func (a *Agent) startPeering(ctx context.Context, comps *components, st state, announced []netip.Prefix, endpoint netip.AddrPort, tun peering.Dataplane, disc *discovery.Discovery) (*peering.Engine, *offloadRelay, error) {
	objects, err := peerapi.New(a.restCfg, a.log.With("component", "peers"))
	if err != nil {
		return nil, nil, err
	}
	relay := newOffloadRelay(objects, objects)
	eng, err := peering.New(peering.Config{
		Identity: st.id, Name: a.cfg.ClusterName, Labels: a.cfg.ClusterLabels, Policy: a.cfg.Peering,
		Networks: announced, Endpoint: endpoint,
		Ledger: st.ledger, Dataplane: a.onAgentClock(tun), Transport: disc, Publisher: relay, Grants: relay,
		UnreachableGrace: a.cfg.UnreachableGrace, Now: a.now,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, nil, err
	}
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
	return eng, relay, nil
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
