package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/policy/policyapi"
)

// startComponents brings the components up in their order, the network
// path first: ledger and identity, tunnel, networks, discovery (made),
// CRDs, peering, Peer objects, gossip; then offloading, the traffic
// policy, DNS and the federation keys. Each registers with comps what
// must be stopped, so Run stops them in reverse.
func (a *Agent) startComponents(ctx context.Context, comps *components) error {
	lap := a.startLaps()
	// Steps on the API server alone run meanwhile from the start; the
	// ledger's snapshot is read while the ledger opens.
	snap := startBackground(ctx, a.newestLedgerSnapshot)
	defer snap.stop()
	nets := startBackground(ctx, a.clusterNetworks)
	defer nets.stop()
	peerCRD := startBackground(ctx, a.ensureCRDs(true))
	defer peerCRD.stop()
	otherCRDs := startBackground(ctx, a.ensureCRDs(false))
	defer otherCRDs.stop()
	fromSecretBg := startBackground(ctx, a.secretFederation)
	defer fromSecretBg.stop()
	st, err := a.openState(ctx, comps, snap)
	if err != nil {
		return err
	}
	lap("state opened")
	// The tunnel needs only its key: its device is made (tens of ms, more
	// for the userspace one) while the networks are read.
	// Before the tunnel: with --gateway-service it listens on what the
	// Service gives.
	addrs, err := a.gatewayAddresses(ctx)
	if err != nil {
		return err
	}
	lap("gateway addresses")
	tun, err := a.startTunnel(comps, st.ledger, addrs.listen.WireGuard)
	if err != nil {
		return err
	}
	if err := a.adoptTunnel(tun); err != nil {
		return err
	}
	lap("tunnel")
	gateway := addrs.own
	if !a.cfg.NodeAddress.IsValid() {
		a.cfg.NodeAddress = gateway
	}
	if a.fabric, err = a.newFabricPlan(comps, gateway); err != nil {
		return err
	}
	detected, err := nets.wait()
	if err != nil {
		return err
	}
	lap("networks read")
	a.podNetworks = detected.Pods
	locals, ann, err := a.startNetworks(ctx, comps, st.ledger, gateway, detected)
	if err != nil {
		return err
	}
	lap("local networks")
	endpoint := addrs.wireguard
	fromSecret, _ := fromSecretBg.wait() // never fails
	var engine atomic.Pointer[peering.Engine]
	disc, err := a.newDiscovery(st, fromSecret, addrs, &engine)
	if err != nil {
		return err
	}
	lap("discovery made")
	announced, _ := ann.current()
	// Segregated traffic (docs/policy.md): every data path the engine
	// applies goes through the policy, which holds the sets the kernel
	// has until its informers have synced (startTrafficFeed, below).
	seg, err := a.newSegregation(tun, fabricDataplane{tun, a.fabric})
	if err != nil {
		return err
	}
	// The Peer informer needs the Peer's CRD; the steps above (discovery's
	// keys, a synced ledger write) do not, and ran while the check was
	// under way. Offloading waits for the other CRDs, after the join.
	if _, err := peerCRD.wait(); err != nil {
		return err
	}
	lap("Peer CRD")
	a.fabric.setNodes(a.fabricNodes, tun.MTU())
	eng, relay, err := a.startPeering(ctx, comps, st, announced.Networks, endpoint, seg, disc)
	if err != nil {
		return err
	}
	engine.Store(eng)
	a.registry.nameFrom(eng.PeerNames)
	a.watchPeers(comps, relay.objects, eng)
	if err := startStep(ctx, eng.Ready(), "peering engine not ready"); err != nil {
		return err
	}
	lap("peering engine ready")
	a.fabric.start()
	a.followLocalNetworks(comps, locals, ann, eng)
	// Before the join: the engine must know every admin's spec (a Deny, a
	// Manual policy's Accept) before discovery reports the first member,
	// or it would peer with a cluster an admin refused.
	if err := startStep(ctx, relay.objects.Synced(), "Peer informer not synced"); err != nil {
		return err
	}
	lap("Peer informer synced")
	if err := a.startDiscovery(ctx, comps, disc, eng); err != nil {
		return err
	}
	lap("gossip")
	// The rest is not on the network path, and runs after the join; the
	// agent is not ready until startComponents returns (Run's "started"
	// check), nor until each part's own check passes.
	a.startGatewayServiceRemoval(comps)
	// Offloading's informers list everything at once: the first fabric
	// plan, which the workers' routes to the peers wait for, is written
	// before they load the API server.
	a.fabric.waitPublished(ctx, firstPlanWait)
	lap("fabric plan published")
	if _, err := otherCRDs.wait(); err != nil {
		return err
	}
	lap("CRDs")
	if err := a.startOffloading(ctx, comps, st, relay, disc, &engine, seg); err != nil {
		return err
	}
	lap("offloading, traffic policy, DNS")
	if err := a.followFederationKeys(comps, disc, st.ledger, st.id.ClusterID(), disc.Snapshot().Gossip); err != nil {
		return err
	}
	a.log.Info("components started", "clusterID", st.id.ClusterID(), "gossip", disc.Snapshot().Gossip, "wireguard", endpoint, "policy", a.cfg.Peering)
	return nil
}

// firstPlanWait bounds how long offloading waits for the first fabric
// plan's write (an API server that refuses it does not hold the start).
const firstPlanWait = 2 * time.Second

// startOffloading makes and starts what the network path does not need:
// offloading and the services, hooked to the engine through relay; the
// traffic policy's feed; the clusterset DNS; the dashboard's feed.
//
// The traffic feed may come after the join: until it has decided once,
// seg holds every Segregated peer's sets the kernel kept from the last
// run and the agent is not ready (docs/policy.md, "Restart").
func (a *Agent) startOffloading(ctx context.Context, comps *components, st state, relay *offloadRelay, disc *discovery.Discovery, engine *atomic.Pointer[peering.Engine], seg *policyapi.SegregatingDataplane) error {
	off, err := a.newOffloading(st, relay.objects, engine)
	if err != nil {
		return err
	}
	if off.services, err = a.newServices(st, disc, off.shared); err != nil {
		return err
	}
	relay.attach(off)
	a.feedDashboard(st.id.ClusterID(), off.objects, off.offloads.Offloads())
	if err := off.start(ctx, comps); err != nil {
		return err
	}
	if err := a.startTrafficFeed(comps, seg, off.shared); err != nil {
		return err
	}
	return a.startClustersetDNS(ctx, comps)
}

// startLaps returns lap, which logs at debug how long the start took
// since the step before (docs/peering.md, "Timeline"): the agent's own
// account of where its start goes.
func (a *Agent) startLaps() (lap func(step string)) {
	last := time.Now()
	return func(step string) {
		now := time.Now()
		a.log.Debug("start step", "step", step, "took", now.Sub(last))
		last = now
	}
}
