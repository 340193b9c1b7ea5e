package agent

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/tunnel"
)

// fabricPlan keeps the cluster's fabric plan (see package fabricapi) in
// line with the data path and the Nodes, and has it published. Without a
// publisher (the agent runs outside a Deployment) it only keeps track.
type fabricPlan struct {
	// publish hands a plan to the publisher (fabricapi.Publisher.Set);
	// nil without one. published is closed once the first is written.
	publish                      func(fabricapi.Plan)
	published                    <-chan struct{}
	gatewayNode, tunnelInterface string
	fallback                     netip.Addr // the gateway's address if its Node has no InternalIP
	// gatewayLease is the Lease the replicas are elected by (ha.LeaseName)
	// when they are: every node's routes follow its holder.
	gatewayLease string

	mu sync.Mutex
	// nodes lists the cluster's Nodes and mtu is the tunnel's; both are
	// set once known (start).
	nodes func() []fabricapi.Node
	mtu   int
	views []netip.Prefix
	// publishing: the plan is published at every change (start); until
	// then the data path's first views are only recorded.
	publishing bool
	// onViews, when set, is told the views at every change (the reverse
	// zones CoreDNS forwards to the agent's DNS); it must not block.
	onViews func([]netip.Prefix)
}

// notifyViews has fn told the views now and at every change, in order:
// fn is called with the plan's lock held, so it must not block.
func (f *fabricPlan) notifyViews(fn func([]netip.Prefix)) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onViews = fn
	fn(slices.Clone(f.views))
}

// setNodes gives the plan what it lacked at first; nothing is published
// before start.
func (f *fabricPlan) setNodes(nodes func() []fabricapi.Node, mtu int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes, f.mtu = nodes, mtu
}

// start publishes the plan, now and at every change. The agent starts it
// once the peering engine has applied the data path it restored: the
// first plan a restarted agent (or a replica taking over) publishes has
// the views the workers route to, not none until a second one.
func (f *fabricPlan) start() {
	f.mu.Lock()
	f.publishing = true
	f.mu.Unlock()
	f.changed()
}

// waitPublished waits until the first plan is written, for at most
// timeout, or returns at once without a publisher.
func (f *fabricPlan) waitPublished(ctx context.Context, timeout time.Duration) {
	if f == nil || f.published == nil {
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.published:
	case <-t.C:
	case <-ctx.Done():
	}
}

// changed publishes the plan again, if there is a publisher and the plan
// is complete and started.
func (f *fabricPlan) changed() {
	if f == nil || f.publish == nil {
		return
	}
	f.mu.Lock()
	nodes, mtu, views, publishing := f.nodes, f.mtu, slices.Clone(f.views), f.publishing
	f.mu.Unlock()
	if nodes == nil || !publishing {
		return
	}
	plan := fabricapi.Plan{
		GatewayNode: f.gatewayNode, Gateway: f.fallback,
		TunnelInterface: f.tunnelInterface, MTU: mtu,
		Views: views, Nodes: nodes(), GatewayLease: f.gatewayLease,
	}
	for _, n := range plan.Nodes {
		if n.Name == f.gatewayNode && n.Addr.IsValid() {
			plan.Gateway = n.Addr
		}
	}
	f.publish(plan)
}

// setViews records the views of a data path applied, and publishes the
// plan when they changed.
func (f *fabricPlan) setViews(d tunnel.Desired) {
	var views []netip.Prefix
	for _, p := range d.Peers {
		for _, v := range p.Views {
			views = append(views, v.As)
		}
	}
	slices.SortFunc(views, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	f.mu.Lock()
	same := slices.Equal(views, f.views)
	f.views = views
	if !same && f.onViews != nil {
		f.onViews(slices.Clone(views))
	}
	f.mu.Unlock()
	if !same {
		f.changed()
	}
}

// fabricDataplane is the tunnel as peering sees it: it gives every data
// path the gateway host's source address and tells the fabric plan its
// views.
type fabricDataplane struct {
	*tunnel.Tunnel
	plan *fabricPlan
}

func (d fabricDataplane) Apply(ctx context.Context, desired tunnel.Desired) error {
	desired.HostSource = d.plan.hostSource(desired.Networks)
	err := d.Tunnel.Apply(ctx, desired)
	d.plan.setViews(desired)
	return err
}

// hostSource is the address the gateway host's own traffic to peers leaves
// with: the first address of the gateway node's pod block (where bridge,
// flannel and Cilium put the host's side), if that block is inside the
// networks announced. Zero without a known node or block: the host then
// reaches no remote pod (docs/fabric.md).
func (f *fabricPlan) hostSource(networks []netip.Prefix) netip.Addr {
	f.mu.Lock()
	nodes := f.nodes
	f.mu.Unlock()
	if nodes == nil || f.gatewayNode == "" {
		return netip.Addr{}
	}
	for _, n := range nodes() {
		if n.Name != f.gatewayNode {
			continue
		}
		for _, block := range n.PodCIDRs {
			src := block.Addr().Next()
			for _, net := range networks {
				if block.Bits() <= 30 && net.Contains(src) && net.Bits() <= block.Bits() {
					return src
				}
			}
		}
	}
	return netip.Addr{}
}

// newFabricPlan prepares the fabric plan; with Config.FabricOwner set it
// publishes it and owns the fabric's DaemonSet, as a component.
func (a *Agent) newFabricPlan(comps *components, gateway netip.Addr) (*fabricPlan, error) {
	f := &fabricPlan{gatewayNode: a.cfg.NodeName, tunnelInterface: a.cfg.WireGuardInterface, fallback: gateway}
	if a.cfg.LeaderElect {
		f.gatewayLease = ha.LeaseName
	}
	if a.cfg.FabricOwner == "" {
		return f, nil
	}
	if a.cfg.Namespace == "" || a.cfg.NodeName == "" {
		return nil, errors.New("the fabric needs the agent's namespace and node name: set --namespace and --node-name (POD_NAMESPACE and NODE_NAME from the downward API)")
	}
	publisher := fabricapi.NewPublisher(a.kube, a.cfg.Namespace, a.cfg.FabricOwner, a.log.With("component", "fabric"), a.registry)
	f.publish, f.published = publisher.Set, publisher.Published()
	comps.Go("fabric publisher", publisher.Run)
	return f, nil
}

// fabricNodes lists the Nodes as the fabric plan names them, each with
// the blocks a CNI with its own IPAM allocated to it.
func (a *Agent) fabricNodes() []fabricapi.Node {
	_, learned := a.learned.current()
	return withLearnedBlocks(a.nodes.fabric(), learned)
}
