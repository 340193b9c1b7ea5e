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

// startPeering runs the negotiation engine, which restores its state and
// applies the data path it found in the ledger before it takes any input
// (eng.Ready). Its states go to the Peer writer, and to offloading once
// made, through relay.
func (a *Agent) startPeering(ctx context.Context, comps *components, st state, announced []netip.Prefix, endpoint netip.AddrPort, tun peering.Dataplane, disc *discovery.Discovery) (*peering.Engine, *offloadRelay, error) {
	objects := a.warm.peerObjects()
	if objects == nil {
		var err error
		if objects, err = a.newPeerObjects(); err != nil {
			return nil, nil, err
		}
	}
	relay := newOffloadRelay(objects, objects)
	eng, err := peering.New(peering.Config{
		Identity: st.id, Name: a.cfg.ClusterName, Labels: a.cfg.ClusterLabels, Policy: a.cfg.Peering,
		Networks: announced, Endpoint: endpoint, OutboundOnly: a.cfg.BehindNAT,
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
	return eng, relay, nil
}

// newPeerObjects is the Peers' informer and status writer, not started.
func (a *Agent) newPeerObjects() (*peerapi.Objects, error) {
	return peerapi.New(a.restCfg, a.log.With("component", "peers"))
}

// watchPeers reports the Peer objects' specs to the engine and writes the
// states it publishes, as a component. The informer lists while the
// engine restores: the specs wait in the engine's input until it runs, and
// objects.Synced says they are all there.
func (a *Agent) watchPeers(comps *components, objects *peerapi.Objects, eng *peering.Engine) {
	comps.Go("Peer objects", func(ctx context.Context) error {
		return objects.Run(ctx, eng)
	})
}

// startStep waits for a step of the start, or for the start to fail.
func startStep(ctx context.Context, done <-chan struct{}, what string) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
}
