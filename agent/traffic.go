package agent

// Segregated traffic (docs/policy.md), the agent's wiring: the
// feed and the segregating data plane live in policy/policyapi.

import (
	"fmt"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/policy/policyapi"
	"github.com/flotilla-io/flotilla/tunnel"
)

// newSegregation wraps the engine's data plane with the traffic policy,
// holding the sets the kernel has from an earlier run until the feed has
// decided (startTrafficFeed).
func (a *Agent) newSegregation(tun *tunnel.Tunnel, dp peering.Dataplane) (*policyapi.SegregatingDataplane, error) {
	held, err := tun.PolicySets()
	if err != nil {
		return nil, fmt.Errorf("traffic policy: read what the kernel holds: %w", err)
	}
	if len(held) > 0 {
		a.log.Info("traffic policy: holding the Segregated peers' sets found in the kernel until the informers have synced", "peers", len(held))
	}
	return policyapi.NewSegregatingDataplane(dp, held, a.log.With("component", "traffic policy")), nil
}

// startTrafficFeed feeds the policy from informers, as a component; the
// agent is not ready until it has decided once.
func (a *Agent) startTrafficFeed(comps *components, seg *policyapi.SegregatingDataplane, peers offload.PeerCache) error {
	feed, err := policyapi.NewFeed(policyapi.FeedConfig{
		Config: a.restCfg, Dataplane: seg, Default: a.cfg.Traffic, Peers: peers,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return err
	}
	a.ready.add("traffic policy", feed.Synced)
	comps.Go("traffic policy", feed.Run)
	return nil
}
