package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
)

// localNetworks keeps the ledger's local networks in line with what this
// cluster and its gateway use: pods, services and the reserved ranges
// (known at start), the gateway's address, the node's connected networks
// and every Node's addresses (watched). A view that comes to overlap one of
// them is remapped, so no peer range shadows an address in use here.
type localNetworks struct {
	log    *slog.Logger
	ledger *ipam.Ledger
	// cluster are the pod, service and reserved ranges; gateway is the
	// address other clusters reach this gateway at.
	cluster []ipam.LocalNetwork
	gateway netip.Addr
	// connected and nodes return the current networks of the host and the
	// addresses of the cluster's Nodes.
	connected func() ([]netip.Prefix, error)
	nodes     func() []netip.Prefix
	// changed holds a signal when the host or the Nodes changed.
	changed chan struct{}

	mu   sync.Mutex
	last []ipam.LocalNetwork // as last given to the ledger
}

// notify asks for a new look; it never blocks.
func (n *localNetworks) notify() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// current gathers the local networks. A node network inside another local
// network adds nothing (views avoid the wider one anyway) and is left out,
// which keeps the list short: a Node's /32 inside its LAN, kube-ipvs0's
// service addresses inside the service range.
func (n *localNetworks) current() ([]ipam.LocalNetwork, error) {
	var out []ipam.LocalNetwork
	for _, l := range n.cluster {
		if !slices.ContainsFunc(out, func(o ipam.LocalNetwork) bool { return o.Range == l.Range }) {
			out = append(out, l)
		}
	}
	connected, err := n.connected()
	if err != nil {
		return nil, fmt.Errorf("networks of this node: %w", err)
	}
	node := append(append([]netip.Prefix{netip.PrefixFrom(n.gateway, n.gateway.BitLen())}, connected...), n.nodes()...)
	// Widest first, so each is checked against every range that may hold it.
	slices.SortStableFunc(node, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	for _, p := range node {
		inside := slices.ContainsFunc(out, func(o ipam.LocalNetwork) bool {
			return o.Range.Addr().Is4() == p.Addr().Is4() && o.Range.Bits() <= p.Bits() && o.Range.Contains(p.Addr())
		})
		if !inside {
			out = append(out, ipam.LocalNetwork{Range: p, Kind: ipam.NodeNetwork})
		}
	}
	slices.SortFunc(out, func(a, b ipam.LocalNetwork) int {
		if c := a.Range.Addr().Compare(b.Range.Addr()); c != 0 {
			return c
		}
		return a.Range.Bits() - b.Range.Bits()
	})
	return out, nil
}

// update gives the ledger the current local networks when they changed,
// and remaps every view that now overlaps one. It returns how many views
// moved: their routes and NAT must follow.
func (n *localNetworks) update() (int, error) {
	nets, err := n.current()
	if err != nil {
		return 0, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.last != nil && slices.Equal(nets, n.last) {
		return 0, nil
	}
	conflicts, err := n.ledger.SetLocalNetworks(nets)
	if err != nil {
		return 0, fmt.Errorf("record local networks: %w", err)
	}
	n.last = nets
	n.log.Info("local networks", "networks", describeLocals(nets))
	moved := 0
	done := map[ipam.ViewRequest]bool{} // a view can overlap several local networks
	for _, c := range conflicts {
		k := ipam.ViewRequest{Peer: c.View.Peer, Remote: c.View.Remote}
		if done[k] {
			continue
		}
		done[k] = true
		view, err := n.ledger.Remap(c.View.Peer, c.View.Remote)
		if err != nil {
			// Retried at the next change; until then the view stays.
			n.last = nil
			return moved, fmt.Errorf("remap the view of %s's %s, which now overlaps local %s network %s: %w", c.View.Peer, c.View.Remote, c.Local.Kind, c.Local.Range, err)
		}
		moved++
		n.log.Warn("view remapped: it overlapped a local network", "peer", c.View.Peer, "range", c.View.Remote,
			"old", c.View.View, "new", view, "local", c.Local.Range, "kind", c.Local.Kind)
	}
	return moved, nil
}

// describeLocals groups ranges by kind for one log line.
func describeLocals(nets []ipam.LocalNetwork) map[ipam.NetworkKind][]netip.Prefix {
	out := map[ipam.NetworkKind][]netip.Prefix{}
	for _, l := range nets {
		out[l.Kind] = append(out[l.Kind], l.Range)
	}
	return out
}

// localNetworksRetry is how soon a failed update is tried again when
// nothing changes meanwhile.
const localNetworksRetry = 30 * time.Second

// run updates the local networks on every change until ctx ends; moved is
// told when views moved, so routes and NAT follow.
func (n *localNetworks) run(ctx context.Context, moved func()) error {
	var retry <-chan time.Time
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.changed:
		case <-retry:
		}
		retry = nil
		m, err := n.update()
		if m > 0 {
			moved()
		}
		if err == nil {
			lastErr = ""
			continue
		}
		if err.Error() != lastErr { // once per change, not per retry
			n.log.Error("cannot update the local networks; retrying", "err", err, "in", localNetworksRetry)
		}
		lastErr = err.Error()
		retry = time.After(localNetworksRetry)
	}
}

// clusterNetworks reads this cluster's pod and service ranges (flags or the
// cluster); the start runs it in the background.
func (a *Agent) clusterNetworks(ctx context.Context) (Networks, error) {
	return detectNetworks(ctx, a.kube, a.cfg.PodCIDRs, a.cfg.ServiceCIDRs)
}

// startNetworks takes this cluster's networks, gives the ledger every local
// network (remapping views that overlap one) and starts watching the Nodes
// and the host's interfaces. It returns the pod ranges to announce and the
// local networks, whose updates followLocalNetworks starts once peering can
// follow moved views.
func (a *Agent) startNetworks(ctx context.Context, comps *components, ledger *ipam.Ledger, gateway netip.Addr, nets Networks) (*localNetworks, *announcer, error) {
	a.log.Info("cluster networks", "pods", nets.Pods, "from", nets.PodSource, "services", nets.Services, "servicesFrom", nets.ServiceSource)
	ranges, err := a.announced(nets.Pods)
	if err != nil {
		return nil, nil, err
	}
	ann := newAnnouncer(a.log, a.cfg.Announce, ranges)
	locals := &localNetworks{
		log: a.log, ledger: ledger, gateway: gateway, changed: make(chan struct{}, 1),
		connected: func() ([]netip.Prefix, error) { return connectedNetworks(a.cfg.WireGuardInterface) },
	}
	for _, p := range nets.Pods {
		locals.cluster = append(locals.cluster, ipam.LocalNetwork{Range: p, Kind: ipam.PodNetwork})
	}
	for _, p := range nets.Services {
		locals.cluster = append(locals.cluster, ipam.LocalNetwork{Range: p, Kind: ipam.ServiceNetwork})
	}
	for _, p := range a.cfg.ReservedCIDRs {
		locals.cluster = append(locals.cluster, ipam.LocalNetwork{Range: p, Kind: ipam.ReservedNetwork})
	}
	// Watch before the first look, so no change falls in between.
	comps.Go("host network events", func(ctx context.Context) error {
		return watchHostNetworks(ctx, a.log, locals.notify)
	})
	nodes, err := a.watchNodes(ctx, comps, func() { locals.notify(); ann.notify(); a.fabric.changed() })
	if err != nil {
		return nil, nil, err
	}
	locals.nodes, a.nodes = nodes.addresses, nodes
	if learnsBlocks(a.cfg.Announce, ranges, ann.pools) {
		a.learned, err = a.watchLearnedBlocks(ctx, comps, a.cfg.PodBlockBits, nodes.virtualNode, func() { ann.notify(); a.fabric.changed() })
		if err != nil {
			return nil, nil, err
		}
		a.log.Info("learning the pod blocks a CNI allocates", "from", a.learned.watching())
	}
	ann.blocks = func() ([]netip.Prefix, string) { return podBlocksInUse(nodes.podBlocks(), a.learned) }
	if _, err := locals.update(); err != nil {
		return nil, nil, err
	}
	return locals, ann, nil
}

// followLocalNetworks keeps the local networks and what is announced
// current from now on, and has the engine follow the views that move and
// renegotiate what is announced.
func (a *Agent) followLocalNetworks(comps *components, locals *localNetworks, ann *announcer, eng *peering.Engine) {
	comps.Go("local networks", func(ctx context.Context) error { return locals.run(ctx, eng.ViewsMoved) })
	comps.Go("announced networks", func(ctx context.Context) error { return ann.run(ctx, eng.SetNetworks) })
}

// announced returns the pod ranges peers are told about, whole or by the
// Nodes' blocks in them (announcer). The tunnel routes
// IPv4 only for now: IPv6 pod ranges stay local networks in the ledger
// (views avoid them) but are not announced.
func (a *Agent) announced(pods []netip.Prefix) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range pods {
		if !p.Addr().Is4() {
			a.log.Warn("IPv6 pod range not announced to peers: the tunnel routes IPv4 only", "range", p)
			continue
		}
		if err := peering.CheckNetwork(p); err != nil {
			return nil, fmt.Errorf("pod range %s cannot be announced to peers: %w", p, err)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no IPv4 pod range among %v: the tunnel routes IPv4 only; pass --pod-cidr with this cluster's IPv4 pod range", pods)
	}
	return out, nil
}

// learnsBlocks reports whether some pod range is announced by its blocks
// (--announce), so the blocks a CNI allocates itself are worth watching.
func learnsBlocks(mode Announce, ranges, pools []netip.Prefix) bool {
	largest := largestPool(pools)
	return slices.ContainsFunc(ranges, func(r netip.Prefix) bool {
		return mode == AnnounceBlocks || mode == AnnounceAuto && r.Bits() < largest
	})
}

// podBlocksInUse are the Nodes' pod blocks and those of the first source
// of learned blocks that has some, and where they came from.
func podBlocksInUse(nodes []netip.Prefix, learned learnedBlocks) ([]netip.Prefix, string) {
	var sources []string
	if len(nodes) > 0 {
		sources = append(sources, sourceNodes)
	}
	name, blocks := learned.current()
	if len(blocks) > 0 {
		sources = append(sources, name)
	}
	return append(nodes, blocksOnly(blocks)...), strings.Join(sources, ", ")
}
