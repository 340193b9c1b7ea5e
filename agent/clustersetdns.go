package agent

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/flotilla-io/flotilla/offload/mcsdns"
)

// startClustersetDNS answers the clusterset.local zone (the Multi-Cluster
// Services API's names) on the gateway node's address, where CoreDNS
// forwards the zone (docs/services.md, "DNS"); --clusterset-dns-port=0
// leaves it off.
func (a *Agent) startClustersetDNS(ctx context.Context, comps *components) error {
	if a.cfg.ClustersetDNSPort == 0 {
		return nil
	}
	srv, err := mcsdns.New(mcsdns.Config{
		Config:     a.restCfg,
		Address:    netip.AddrPortFrom(a.cfg.NodeAddress, uint16(a.cfg.ClustersetDNSPort)),
		ClientRate: a.cfg.ClustersetDNSClientRate, ClientBurst: a.cfg.ClustersetDNSClientBurst,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return fmt.Errorf("--clusterset-dns-port: %w", err)
	}
	comps.Go("clusterset DNS", srv.Run)
	return nil
}
