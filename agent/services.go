package agent

import (
	"context"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/peering"
)

// services is the agent's part in the Multi-Cluster Services API
// (docs/services.md): this cluster's exports go to every Connected peer
// over the gossip (discovery.SendServices), the peers' exports come back
// through OnServices (agent/gossip.go) and are imported here; and the
// cluster's ClusterProperties say who it is.
type services struct {
	mcs        *mcs.Services
	properties *mcs.ClusterProperties
}

func (a *Agent) newServices(st state, disc *discovery.Discovery, shared *offload.SharedCache) (services, error) {
	s, err := mcs.New(mcs.Config{
		Config: a.restCfg, Identity: st.id, Send: disc.SendServices, Views: ledgerViews{st.ledger}, Serials: st.ledger,
		Grace: a.cfg.UnreachableGrace, Shared: shared, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return services{}, err
	}
	p, err := mcs.NewClusterProperties(a.restCfg, st.id.ClusterID(), a.cfg.ClusterSetName, a.log)
	if err != nil {
		return services{}, err
	}
	a.services.Store(s)
	return services{mcs: s, properties: p}, nil
}

// peerChanged tells the exporter who is Connected and the peers' keys,
// which verify their exports.
func (s services) peerChanged(st peering.PeerState) {
	if s.mcs != nil {
		s.mcs.PeerChanged(st)
	}
}

func (s services) start(comps *components) {
	if s.mcs == nil {
		return
	}
	comps.Go("multi-cluster services", s.mcs.Run)
	comps.Go("cluster properties", func(ctx context.Context) error { return s.properties.Run(ctx) })
}
