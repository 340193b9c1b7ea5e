// Package fabric makes every node of a cluster part of the federation:
// pods on any node reach the peers' networks through the gateway node,
// and traffic from the peers reaches pods on any node. It is the
// node-level half; the tunnel (package tunnel) runs on the gateway node
// only, and a Kubernetes adapter (`flotilla fabric`) feeds Apply with the
// desired state. It imports nothing of Kubernetes.
//
// On a worker node it routes every view (a range the cluster uses for a
// peer's network) via the gateway node's address, in a routing table of
// our own that one rule makes every lookup consult first:
//
//	ip rule add priority 20000 lookup 102 proto 102
//	ip route add <view> via <gateway> dev <link> table 102 proto 102 mtu <MTU>
//
// On the gateway node it routes traffic that arrives from the tunnel to
// the node that holds its pod block:
//
//	ip rule add priority 20000 iif <tunnel> lookup 102 proto 102
//	ip route add <node's pod block> via <node> dev <link> table 102 proto 102
//
// The routes are direct where the gateway (or the node) is on a network
// this node is connected to, which RouteGet tells. Where a router is in
// between, they go through an overlay instead: one VXLAN link of ours per
// node (tagged with our alias, never adopted by name), unicast FDB
// entries and permanent neighbour entries only, and next hops derived
// from the nodes' addresses inside a range of our own (240.0.0.0/8):
//
//	ip link add flotilla-vx type vxlan id 102 dstport 6102 nolearning
//	bridge fdb append <peer's MAC> dev flotilla-vx dst <peer node> self permanent
//	ip neigh replace <peer's next hop> lladdr <peer's MAC> dev flotilla-vx nud permanent
//	ip route add <view or block> via <peer's next hop> dev flotilla-vx onlink table 102 proto 102
//
// A table of our own keeps the CNI's
// routes in main untouched and our routes easy to tell apart: ours are
// the routes in our table with our protocol number, and the rules that
// point at our table with our protocol number. Nothing else is changed or
// removed, whatever it is.
//
// On every node, both roles, an nftables table of our own exempts view
// traffic from a CNI's masquerade with an identity SNAT:
//
//	table ip flotilla-fabric {
//		set views { type ipv4_addr; flags interval; elements = { <views> } }
//		chain exempt {
//			type nat hook postrouting priority 95; policy accept;
//			ip daddr @views snat ip to ip saddr
//			ip saddr @views snat ip to ip saddr
//		}
//	}
//
// On the gateway node the same table holds a guard that lets traffic to a
// view leave only through the tunnel: while the tunnel has no route for it
// (a replica taking over, a fenced one), it would otherwise follow the
// node's default route out onto the node network, in the clear:
//
//	chain guard-forward { type filter hook forward priority filter; ip daddr @views oifname != <tunnel> counter drop }
//	chain guard-output  { type filter hook output priority filter; ip daddr @views oifname != <tunnel> counter drop }
//
// The kernel runs the NAT chains of a hook in priority order and stops at
// the first that binds a connection's source NAT; the identity SNAT binds
// it without changing anything, so a masquerade in a later chain
// (iptables-nft's nat POSTROUTING at 100, an nft chain at srcnat) never
// applies to view traffic, whatever order its own rules are in. The
// tunnel's SNAT runs at 90 on the gateway, before this chain.
//
// Apply changes only the difference to what exists; Run puts back what
// someone removes, on route, rule, link and nftables events and every 30
// seconds; Remove takes away everything ours.
package fabric

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Defaults for Config.
const (
	// DefaultTable is our routing table, 102 like our protocol number.
	DefaultTable = 0x66
	// DefaultRulePriority puts our rule before main's (32766), after
	// local's (0).
	DefaultRulePriority = 20000
	DefaultNFTable      = "flotilla-fabric"
	// DefaultOverlayLink is our VXLAN link's name.
	DefaultOverlayLink = "flotilla-vx"
	// DefaultHostLabel labels the address on lo holding a worker's host
	// source (hostsource.go).
	DefaultHostLabel = "lo:flotilla"
	// DefaultVXLANPort and DefaultVNI are no common CNI's: flannel and
	// Cilium use 8472, Calico and Antrea 4789, Submariner 4800, Liqo's
	// Geneve 6091, Geneve itself 6081. 102 is our number, as for the
	// table and the route protocol.
	DefaultVXLANPort = 6102
	DefaultVNI       = 102
	// resyncInterval bounds how long a change no event reports stays
	// unrepaired.
	resyncInterval = 30 * time.Second
)

// Config configures a Fabric. Zero values take the defaults.
type Config struct {
	// Table is the routing table our routes go in; a table of our own,
	// not main, local or default.
	Table int
	// RulePriority is the priority of our one rule; before main's 32766.
	RulePriority int
	// RouteProtocol tags our routes and rules; default
	// tunnel.DefaultRouteProtocol, and no routing daemon's number.
	RouteProtocol int
	// NFTable is the name of our nftables table (family ip).
	NFTable string
	// OverlayLink names our VXLAN link, used only between nodes that do
	// not share a link with the gateway.
	OverlayLink string
	// HostLabel labels our address on lo, a worker's HostSource; it
	// starts with "lo:".
	HostLabel string
	// VXLANPort (UDP) and VNI of the overlay; the same on every node.
	VXLANPort int
	VNI       int
	// OverlayRange holds the overlay's next hops, one per node, derived
	// from its address (see DefaultOverlayRange); it must not overlap a
	// view or pod block.
	OverlayRange netip.Prefix
	Logger       *slog.Logger
	Metrics      prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.Table == 0 {
		c.Table = DefaultTable
	}
	if c.RulePriority == 0 {
		c.RulePriority = DefaultRulePriority
	}
	if c.RouteProtocol == 0 {
		c.RouteProtocol = tunnel.DefaultRouteProtocol
	}
	if c.NFTable == "" {
		c.NFTable = DefaultNFTable
	}
	if c.OverlayLink == "" {
		c.OverlayLink = DefaultOverlayLink
	}
	if c.HostLabel == "" {
		c.HostLabel = DefaultHostLabel
	}
	if c.VXLANPort == 0 {
		c.VXLANPort = DefaultVXLANPort
	}
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	if !c.OverlayRange.IsValid() {
		c.OverlayRange = DefaultOverlayRange
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	switch c.Table {
	case unix.RT_TABLE_MAIN, unix.RT_TABLE_LOCAL, unix.RT_TABLE_DEFAULT:
		return fmt.Errorf("route table %d is one of the kernel's (main, local, default): the fabric needs a table of its own, such as the default %d", c.Table, DefaultTable)
	}
	if c.Table < 1 || c.Table > 0xfffffffe {
		return fmt.Errorf("route table %d out of range 1..4294967294", c.Table)
	}
	if c.RulePriority < 1 || c.RulePriority >= 32766 {
		return fmt.Errorf("rule priority %d: want 1..32765, before the main table's rule (32766), such as the default %d", c.RulePriority, DefaultRulePriority)
	}
	if err := tunnel.CheckRouteProtocol(c.RouteProtocol); err != nil {
		return err
	}
	if len(c.NFTable) > 255 || strings.ContainsAny(c.NFTable, " \t\n/") {
		return fmt.Errorf("nftables table name %q: at most 255 characters, no spaces or '/'", c.NFTable)
	}
	if len(c.OverlayLink) >= 16 || strings.ContainsAny(c.OverlayLink, "/ \t\n") {
		return fmt.Errorf("overlay link name %q: 1 to 15 characters, no '/' or spaces", c.OverlayLink)
	}
	if len(c.HostLabel) >= 16 || len(c.HostLabel) <= 3 || !strings.HasPrefix(c.HostLabel, "lo:") || strings.ContainsAny(c.HostLabel, "/ \t\n") {
		return fmt.Errorf("host address label %q: \"lo:\" and a name, 15 characters at most, no '/' or spaces, such as the default %s", c.HostLabel, DefaultHostLabel)
	}
	if c.VXLANPort < 1 || c.VXLANPort > 65535 {
		return fmt.Errorf("VXLAN port %d out of range 1..65535", c.VXLANPort)
	}
	if c.VNI < 1 || c.VNI >= 1<<24 {
		return fmt.Errorf("VNI %d out of range 1..16777215", c.VNI)
	}
	if r := c.OverlayRange; !r.Addr().Is4() || r != r.Masked() || r.Bits() < 4 || r.Bits() > 24 {
		return fmt.Errorf("overlay range %s: want a canonical IPv4 prefix of /4 to /24 no network uses, such as the default %s", r, DefaultOverlayRange)
	}
	return nil
}

// DefaultOverlayRange is reserved (class E): no network routes it, so a
// next hop in it never names a real host. Linux handles it as unicast.
var DefaultOverlayRange = netip.MustParsePrefix("240.0.0.0/8")

// Role is what a node does in the fabric.
type Role string

const (
	// Worker nodes route the views via the gateway node.
	Worker Role = "worker"
	// Gateway is the node the tunnel runs on; it routes what arrives from
	// the tunnel to the node holding the destination's pod block.
	Gateway Role = "gateway"
)

// Desired is what the fabric makes on one node. Fields of the other role
// are ignored.
type Desired struct {
	Role Role
	// Addr is this node's own address on the node network as the others
	// know it (its Node's InternalIP). Needed only where the overlay is:
	// the overlay derives this node's VXLAN address from it.
	Addr netip.Addr
	// Gateway (workers): the gateway node's address on the node network;
	// every view is routed via it.
	Gateway netip.Addr
	// Views: every range this cluster uses for its peers' networks (the
	// As side of all views of all peers). Both roles exempt them from
	// masquerade.
	Views []netip.Prefix
	// MTU (workers): route MTU for the views (the tunnel's MTU); 0 sets
	// none.
	MTU int
	// Nodes (gateway): the other nodes' pod blocks and addresses; traffic
	// arriving from the tunnel to a block goes to its node. A node whose
	// address is this node's own is skipped.
	Nodes []Node
	// TunnelInterface (gateway): the WireGuard link's name, for the rule
	// `iif <it> lookup <table>`.
	TunnelInterface string
	// HostSource (workers): the address the node's own traffic to a view
	// leaves with, the first address of its pod block; kept on lo under
	// our label and set as the views' preferred source (hostsource.go).
	// Zero: none, and the host reaches no remote pod.
	HostSource netip.Addr
}

// Node is one node of the cluster as the gateway sees it.
type Node struct {
	Addr     netip.Addr
	PodCIDRs []netip.Prefix
}

// Fabric reconciles one node's routes, rule and masquerade exemption.
type Fabric struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	kick    chan struct{}
	resync  time.Duration

	mu      sync.Mutex
	desired *Desired // nil until the first valid Apply
	failing string   // the apply or repair error last logged

	// links are the indexes of the links our routes go through, for the
	// event reader to tell which link events concern us; overlayLink is
	// our VXLAN link's (0: none), whose FDB and neighbours are ours.
	links       atomic.Pointer[map[int]bool]
	overlayLink atomic.Int64
	// hostLink is the index of lo while it holds our host source (0:
	// none), for the event reader.
	hostLink atomic.Int64

	buffersMu sync.Mutex
	buffers   map[string]int // event receive buffer sizes by stream kind, for tests

	// inNetns takes reads that must run in the fabric's network namespace
	// to Run's goroutine, which works in it, while running says it does.
	inNetns chan func()
	running atomic.Bool
}

// New returns a Fabric that has changed nothing yet.
func New(cfg Config) (*Fabric, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("fabric config: %w", err)
	}
	f := &Fabric{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), resync: resyncInterval, inNetns: make(chan func())}
	f.metrics = newMetrics(f.guardDropped)
	if cfg.Metrics != nil {
		if err := f.metrics.register(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("register fabric metrics: %w", err)
		}
	}
	return f, nil
}

// Apply makes the node's routes, rule and exemption exactly those of d,
// changing only the difference. Invalid input is refused before anything
// changes; a repair Run makes later uses d too.
func (f *Fabric) Apply(d Desired) error {
	d = d.clone()
	if err := d.validate(); err != nil {
		return fmt.Errorf("fabric desired state: %w", err)
	}
	p, err := f.plan(d)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.desired = &d
	ch, err := f.reconcile(p)
	if err != nil {
		f.trigger() // Run tries again, with a backoff
		return err
	}
	if ch.any() {
		f.log.Info("fabric applied", "role", d.Role, "views", len(d.Views), "routes", len(p.routes),
			"routesAdded", ch.routesAdded, "routesChanged", ch.routesChanged, "routesDeleted", ch.routesDeleted,
			"rules", ch.rules, "exemption", ch.nft, "overlay", ch.overlay)
	}
	return nil
}

// reconcile brings routes, rule and exemption in line with p; it reports
// what it changed. Callers hold f.mu. On the gateway node the nftables
// table, with its guard, comes first, before the routes that sent the
// views to another gateway go; elsewhere it comes last, the guard going
// only once the routes to the gateway are in place: traffic to a view
// never meets the node's default route.
func (f *Fabric) reconcile(p plan) (changes, error) {
	var ch changes
	var errs []error
	reconcileNFT := func() {
		n, err := reconcileExemption(f.cfg.NFTable, p.views, p.iif)
		ch.nft = n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if p.iif != "" {
		reconcileNFT()
	}
	links := make(map[int]bool, len(p.links)+1)
	for _, l := range p.links {
		links[l] = true
	}
	vx, err := f.reconcileOverlay(p.overlay, &ch)
	f.overlayLink.Store(int64(vx))
	if vx != 0 {
		links[vx] = true
	}
	// The routes' preferred source must be an address of this node first.
	lo, hostErr := f.reconcileHostSource(p.hostSource, &ch)
	f.hostLink.Store(int64(lo))
	f.links.Store(&links)
	if hostErr != nil {
		errs = append(errs, hostErr)
	}
	if err != nil {
		// Overlay routes cannot be right without their link: the routes
		// stay as they are until the next repair.
		errs = append(errs, err)
	} else {
		for dst, r := range p.routes {
			if r.overlay {
				r.link = vx
				p.routes[dst] = r
			}
		}
		if err := f.reconcileRoutes(p, &ch); err != nil {
			errs = append(errs, err)
		}
	}
	if err := f.reconcileRules(p, &ch); err != nil {
		errs = append(errs, err)
	}
	if p.iif == "" {
		reconcileNFT()
	}
	return ch, errors.Join(errs...)
}

// changes counts what one reconcile changed.
type changes struct {
	routesAdded, routesChanged, routesDeleted int
	rules                                     int // rules added or deleted
	nft                                       int // nftables objects and elements
	overlay                                   int // overlay link, its settings, FDB and neighbour entries
	links                                     int // the host source's address
}

func (c changes) any() bool { return c.total() > 0 }

func (c changes) total() int {
	return c.routesAdded + c.routesChanged + c.routesDeleted + c.rules + c.nft + c.overlay + c.links
}

// Remove deletes everything the fabric with cfg made on this node: the
// routes in our table with our protocol, the rules pointing at our table
// with our protocol, our nftables table and our VXLAN link (with its FDB
// and neighbours). Nothing else is touched.
func Remove(cfg Config) error {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("fabric config: %w", err)
	}
	return errors.Join(
		removeRoutes(cfg),
		removeRules(cfg),
		removeExemption(cfg.NFTable),
		removeOverlay(cfg),
		removeHostSource(cfg),
	)
}

// Remove deletes everything of the fabric on this node (the package's
// Remove) and forgets the desired state, so Run repairs nothing until the
// next Apply.
func (f *Fabric) Remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.desired = nil
	return Remove(f.cfg)
}
