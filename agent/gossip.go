package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/peering"
)

// newDiscovery prepares gossip; startDiscovery starts it once the engine
// that handles its messages and member events runs. Messages that arrive
// before then are dropped: senders repeat them.
func (a *Agent) newDiscovery(st state, fromSecret secretKeys, addrs gatewayAddrs, engine *atomic.Pointer[peering.Engine]) (*discovery.Discovery, error) {
	keys, err := a.federationKeys(st.ledger, fromSecret)
	if err != nil {
		return nil, err
	}
	advertise := addrs.gossip
	bind := netip.AddrPortFrom(a.cfg.GossipAddr.Addr(), addrs.listen.Gossip)
	disc, err := discovery.New(discovery.Config{
		Identity: st.id, Keys: keys.keys, Protocol: peering.ProtocolVersion,
		BindAddr: bind, AdvertiseAddr: advertise, Endpoint: addrs.wireguard.String(), OutboundOnly: a.cfg.BehindNAT,
		MDNS: a.cfg.MDNS, DNSDomains: a.cfg.DNSDomains, DNSServer: a.cfg.DNSServer,
		Seeds: append(append([]string{}, a.cfg.Joins...), keys.seeds...), Profile: discovery.Profile(a.cfg.GossipProfile),
		Packets: a.cfg.GossipPackets,
		OnMessage: func(msg []byte) {
			if e := engine.Load(); e != nil {
				e.Receive(msg)
			}
		},
		OnServices: func(msg []byte) {
			if s := a.services.Load(); s != nil {
				s.Receive(msg)
			}
		},
		Serials: st.ledger, Now: a.now,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	if err := st.ledger.PutKey(keyGossipAdvertise, []byte(advertise.String())); err != nil {
		return nil, fmt.Errorf("record the gossip address: %w", err)
	}
	return disc, nil
}

// startDiscovery joins the gossip and hands member events to the engine.
func (a *Agent) startDiscovery(ctx context.Context, comps *components, disc *discovery.Discovery, eng *peering.Engine) error {
	if err := disc.Start(ctx); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	comps.OnStop("discovery", disc.Close) // members see a Leave
	comps.Go("member events", func(ctx context.Context) error {
		for ev := range disc.Subscribe(ctx) {
			sources := make([]string, 0, len(ev.Member.Sources))
			for _, s := range ev.Member.Sources {
				sources = append(sources, string(s))
			}
			eng.MemberChanged(peering.Member{
				ClusterID: ev.Member.ClusterID, PublicKey: ev.Member.Record.PublicKey,
				Gossip: ev.Member.Gossip.String(), Alive: ev.Kind == discovery.Join || ev.Kind == discovery.Update,
				Sources: sources, OutboundOnly: ev.Member.Record.OutboundOnly,
			})
		}
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("discovery closed the stream of member events")
	})
	a.ready.add("discovery", func() error {
		if disc.Snapshot().Gossip == "" {
			return errors.New("gossip not running")
		}
		return nil
	})
	return nil
}
