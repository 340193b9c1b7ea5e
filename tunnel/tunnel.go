// Package tunnel makes the encrypted data path between this cluster's
// gateway and its peers exist: one WireGuard interface (kernel or embedded
// userspace), one WireGuard peer per remote cluster, routes for my views of
// the peers' networks, and per-peer prefix NAT in an nftables table of our
// own. It is a reconciler: given the desired state it changes only the
// difference to what exists, owns only what it tagged, and puts back what
// someone removes.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flotilla-io/flotilla/internal/eventstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
)

// Defaults for Config.
const (
	DefaultInterface = "flotilla0"
	DefaultPort      = 51820
	// DefaultRouteProtocol tags our routes (rtnetlink protocol 102, unused
	// by the kernel and every routing daemon; see CheckRouteProtocol).
	DefaultRouteProtocol = 0x66
	// DefaultRouteTable is the main table: views are plain routes there.
	DefaultRouteTable = unix.RT_TABLE_MAIN
	DefaultNFTable    = "flotilla"
	// overhead is what WireGuard adds to a packet over IPv6: 40 IP, 8 UDP,
	// 32 WireGuard; the MTU leaves room for it whatever the underlay.
	overhead = 80
	// resyncInterval bounds how long a change no event reports (a peer
	// edited with wg set) stays unrepaired.
	resyncInterval = 30 * time.Second
)

// Config configures a Tunnel. Zero values take the defaults above.
type Config struct {
	// Interface is the WireGuard link's name. wireguard-go's control socket
	// is named after it host-wide, so it must be unique per host.
	Interface string
	// Mode selects kernel or userspace WireGuard; default auto.
	Mode Mode
	// ListenPort is the UDP port WireGuard listens on.
	ListenPort int
	// PrivateKey is this cluster's WireGuard private key; required. The
	// caller keeps it (the agent in its ledger) and rotates it with
	// SetPrivateKey.
	PrivateKey Key
	// MTU overrides the link MTU; default the underlay's (the default
	// route's link) minus WireGuard's overhead.
	MTU int
	// RouteTable and RouteProtocol say where our routes go and tag them.
	RouteTable    int
	RouteProtocol int
	// NFTable is the name of our nftables table (family ip).
	NFTable string
	// FirstContactWait is how long the side of a new peering that waits
	// for the other to initiate waits before it initiates itself (see
	// firstcontact.go); default DefaultFirstContactWait.
	FirstContactWait time.Duration
	Logger           *slog.Logger
	Metrics          prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.Interface == "" {
		c.Interface = DefaultInterface
	}
	if c.Mode == "" {
		c.Mode = ModeAuto
	}
	if c.ListenPort == 0 {
		c.ListenPort = DefaultPort
	}
	if c.RouteTable == 0 {
		c.RouteTable = DefaultRouteTable
	}
	if c.RouteProtocol == 0 {
		c.RouteProtocol = DefaultRouteProtocol
	}
	if c.NFTable == "" {
		c.NFTable = DefaultNFTable
	}
	if c.FirstContactWait == 0 {
		c.FirstContactWait = DefaultFirstContactWait
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	if len(c.Interface) >= 16 || strings.ContainsAny(c.Interface, "/ \t\n") {
		return fmt.Errorf("interface name %q: at most 15 characters, no '/' or spaces", c.Interface)
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if c.ListenPort < 1 || c.ListenPort > 65535 {
		return fmt.Errorf("listen port %d out of range", c.ListenPort)
	}
	if c.MTU != 0 && (c.MTU < 1280 || c.MTU > 65535) {
		return fmt.Errorf("mtu %d out of range 1280..65535", c.MTU)
	}
	if err := CheckRouteProtocol(c.RouteProtocol); err != nil {
		return err
	}
	return nil
}

// PeerStatus is what WireGuard reports about one peer.
type PeerStatus struct {
	ClusterID     string
	PublicKey     Key
	Endpoint      netip.AddrPort // in use; zero before the first handshake if none was given
	LastHandshake time.Time      // zero: never
	RxBytes       int64
	TxBytes       int64
}

// Tunnel reconciles the data path to the peers.
type Tunnel struct {
	cfg  Config
	log  *slog.Logger
	mtu  int
	kick chan struct{}

	pendingMu sync.Mutex
	pending   scope    // what the next repair must read back
	nftGens   []uint32 // nftables generations that touched our table, to check
	// policyGens are those that touched the filter table (filter.go).
	policyGens []uint32

	mu     sync.Mutex
	link   *wgLink
	wg     *wgctrl.Client
	rt     *routeTable
	nat    *natTable
	filter *filterTable
	nft    *nftSession // both tables'
	// netns is the network namespace New ran in, where every object of
	// ours lives: the metrics read the filter's counters from goroutines
	// that may run anywhere.
	netns     netns.NsHandle
	wgApplied *wgRecord // nil when unknown
	key       Key
	pub       Key      // of key
	desired   *Desired // nil before the first Apply
	peerIDs   map[Key]string
	closed    bool
	// suspended: the data path is removed and kept away until Resume,
	// while Apply goes on recording the desired state.
	suspended bool
	metrics   *metrics
	lastLink  int // ifindex seen at the last reconcile
	// ownLink is lastLink for the event readers, which do not take mu.
	ownLink atomic.Int64
	// waiting holds the new peers whose first handshake this side leaves
	// to them, since when (firstcontact.go).
	waiting      map[Key]time.Time
	contactTimer *time.Timer
	// contacts is what each peer says of its side of the first handshake.
	contacts map[Key]FirstContact

	// resync is how often Run reads everything back; eventBuffer sets
	// the receive buffer of an event stream by kind (0: the default).
	// Tests change them, to see repairs that only events can bring.
	resync      time.Duration
	eventBuffer map[string]int
}

// scope says which kinds of owned objects a reconcile reads back from the
// kernel instead of trusting the record of what it last made.
type scope uint8

const (
	fullWireGuard scope = 1 << iota
	fullRoutes
	fullNAT
	fullPolicy
	fullAll = fullWireGuard | fullRoutes | fullNAT | fullPolicy
)

// New adopts the interface of a previous run, or creates it, and returns
// a Tunnel that changes nothing more until the first Apply: a restarted
// agent keeps forwarding with the state it left behind.
func New(cfg Config) (*Tunnel, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tunnel config: %w", err)
	}
	if cfg.PrivateKey.IsZero() {
		return nil, errors.New("tunnel config: no WireGuard private key")
	}
	t := &Tunnel{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "tunnel", "link", cfg.Interface),
		rt:      &routeTable{table: cfg.RouteTable, protocol: cfg.RouteProtocol},
		kick:    make(chan struct{}, 1),
		key:     cfg.PrivateKey,
		pub:     cfg.PrivateKey.PublicKey(),
		peerIDs: map[Key]string{},
		waiting: map[Key]time.Time{},
		resync:  resyncInterval,
	}
	t.mtu = cfg.MTU
	if t.mtu == 0 {
		t.mtu = underlayMTU() - overhead
	}
	wg, err := wgctrl.New()
	if err != nil {
		return nil, fmt.Errorf("open wireguard control: %w", err)
	}
	t.wg = wg
	if _, err := t.ensureLink(); err != nil {
		t.wg.Close()
		return nil, err
	}
	if t.netns, err = netns.Get(); err != nil {
		t.wg.Close()
		return nil, fmt.Errorf("open this network namespace: %w", err)
	}
	t.nft = &nftSession{ns: t.netns}
	t.nat = &natTable{name: cfg.NFTable, ifname: cfg.Interface, nft: t.nft}
	t.filter = &filterTable{name: PolicyTable(cfg.NFTable), ifname: cfg.Interface, nft: t.nft}
	t.metrics = newMetrics(t)
	if cfg.Metrics != nil {
		if err := t.metrics.register(cfg.Metrics); err != nil {
			t.Close()
			return nil, fmt.Errorf("register tunnel metrics: %w", err)
		}
	}
	return t, nil
}

// underlayMTU is the MTU of the default route's link, 1500 if there is none.
func underlayMTU() int {
	u, err := DefaultRoute()
	if err != nil {
		return 1500
	}
	return u.MTU
}

// ensureLink makes sure the link exists, is ours, is up, and is served,
// and reports whether it opened a new one (whose peers and routes are
// gone). Called with mu held or before the Tunnel is shared.
func (t *Tunnel) ensureLink() (bool, error) {
	if t.link != nil {
		l, err := netlink.LinkByName(t.cfg.Interface)
		if err == nil && l.Attrs().Index == t.lastLink {
			return false, t.linkUp(l)
		}
		// Deleted (or replaced) under us: serve a new one.
		t.log.Warn("wireguard link disappeared; recreating it")
		t.link.close()
		t.link = nil
	}
	t.wgApplied = nil
	t.rt.invalidate()
	link, err := openLink(t.cfg.Interface, t.cfg.Mode, t.mtu, t.log)
	if err != nil {
		return true, err
	}
	t.link = link
	l, err := netlink.LinkByName(t.cfg.Interface)
	if err != nil {
		return true, fmt.Errorf("look up link %s: %w", t.cfg.Interface, err)
	}
	t.lastLink = l.Attrs().Index
	t.ownLink.Store(int64(t.lastLink))
	return true, t.linkUp(l)
}

func (t *Tunnel) linkUp(l netlink.Link) error {
	if l.Attrs().MTU != t.mtu {
		if err := netlink.LinkSetMTU(l, t.mtu); err != nil {
			return fmt.Errorf("set mtu of %s to %d: %w", t.cfg.Interface, t.mtu, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("bring %s up: %w", t.cfg.Interface, err)
		}
	}
	return nil
}

// Apply makes the desired state exist and remembers it for repairs. Bad
// input is refused before anything changes.
func (t *Tunnel) Apply(ctx context.Context, d Desired) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("apply tunnel state: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("apply tunnel state: tunnel closed")
	}
	d = cloneDesired(d)
	old := t.desired
	t.desired = &d
	_, err := t.reconcileLocked(0)
	if old != nil {
		// After the new mapping is in place: an entry deleted before it
		// could be made again under the old one.
		t.flushStaleFlows(*old, d)
	}
	return err
}

// flushStaleFlows deletes the conntrack entries of flows that old's
// mappings made and d's no longer make (conntrack.go). A failure leaves
// those flows to time out; it is logged, not returned, as the data path
// itself is in place.
func (t *Tunnel) flushStaleFlows(old, d Desired) {
	n, err := flushFlows(staleFlows(old, d))
	t.metrics.conntrackFlushed.Add(float64(n))
	if err != nil {
		t.log.Warn("flows of released views keep their old translation until they time out", "err", err)
		return
	}
	if n > 0 {
		t.log.Info("flushed conntrack entries of released or remapped views", "entries", n)
	}
}

// SetPrivateKey rotates this cluster's WireGuard key. Peers must learn the
// new public key (the peering layer announces it); until they do, the
// tunnels to them are down. The caller persists the key.
func (t *Tunnel) SetPrivateKey(k Key) error {
	if k.IsZero() {
		return errors.New("rotate wireguard key: empty key")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.key, t.pub = k, k.PublicKey()
	if t.suspended {
		return nil // Resume configures the device with it
	}
	if err := t.configureDevice(); err != nil {
		return fmt.Errorf("rotate wireguard key: %w", err)
	}
	return nil
}

// PublicKey is the public key peers must be told.
func (t *Tunnel) PublicKey() Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pub
}

// Kernel reports whether kernel WireGuard serves the link.
func (t *Tunnel) Kernel() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.link != nil && t.link.kernel
}

// reconcileLocked brings every owned object in line with t.desired and
// returns how many objects it changed. Kinds of objects in full are read
// back from the kernel; the others are changed from the record of what
// the last reconcile made, which touches only the peers that differ.
func (t *Tunnel) reconcileLocked(full scope) (int, error) {
	if t.desired == nil || t.suspended {
		return 0, nil
	}
	start := time.Now()
	defer func() { t.metrics.reconcileSeconds.Observe(time.Since(start).Seconds()) }()
	d := *t.desired
	if _, err := t.ensureLink(); err != nil {
		return 0, err
	}
	// The data path opens last and closes first: a departed peer leaves
	// the device before its translation and filter go, and a new one
	// joins it only after them, so no packet of a peer's is forwarded
	// without its translation or, Segregated, its filter (a replica
	// taking over sets everything up at once).
	changes := 0
	var errs []error
	t0 := time.Now()
	n, err := t.removeDeparted(d)
	changes += n
	errs = append(errs, err)
	if err := enableForwarding(); err != nil {
		errs = append(errs, err)
	}
	n, err = t.nat.reconcile(NAT(d), d.Networks, full&fullNAT != 0)
	changes += n
	errs = append(errs, err)
	t1 := time.Now()
	n, err = t.filter.reconcile(Filters(d), full&fullPolicy != 0)
	changes += n
	errs = append(errs, err)
	t.metrics.policySeconds.Observe(time.Since(t1).Seconds())
	t2 := time.Now()
	n, err = t.configurePeers(d, full&fullWireGuard != 0)
	changes += n
	errs = append(errs, err)
	t.scheduleFirstContacts()
	// The source must be on the link before a route can name it.
	n, err = setHostSource(t.lastLink, d.HostSource)
	changes += n
	errs = append(errs, err)
	t3 := time.Now()
	n, err = t.rt.reconcile(t.lastLink, Routes(d), d.HostSource, full&fullRoutes != 0)
	changes += n
	errs = append(errs, err)
	t.log.Debug("reconciled", "changes", changes, "full", full, "nat", t1.Sub(t0), "policy", t2.Sub(t1), "wireguard", t3.Sub(t2), "routes", time.Since(t3))
	if err := errors.Join(errs...); err != nil {
		t.metrics.reconcileErrors.Inc()
		return changes, err
	}
	return changes, nil
}

// enableForwarding turns on IPv4 forwarding in this network namespace; a
// gateway that does not forward carries nothing. It is left on at cleanup:
// the host may have wanted it before us.
func enableForwarding() error {
	const p = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable ip forwarding: %w", err)
	}
	return nil
}

// Status reports per-peer WireGuard state, sorted by cluster ID.
func (t *Tunnel) Status() ([]PeerStatus, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statusLocked()
}

// Run watches for changes to what we own (routes, the link, our nftables
// table) and puts back whatever differs from the last applied state, until
// ctx ends. Route and link changes come from rtnetlink events, nftables
// changes from its netlink monitor; a subscription that ends on an error
// is opened again (internal/eventstream). A periodic resync catches the rest
// (WireGuard peer edits send no event). Run returns once every goroutine
// it started has ended.
func (t *Tunnel) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	events, err := eventstream.Watch(ctx, &wg, t.streams(), eventstream.Hooks{
		Log:      t.log,
		Lost:     func() { t.trigger(fullAll) },
		Reopened: func(kind string) { t.metrics.resubscribes.WithLabelValues(kind).Inc() },
	})
	if err != nil {
		return err
	}
	t.log.Debug("watching kernel events", "events", []string{eventsRoute, eventsLink, eventsNFT})
	tick := time.NewTicker(t.resync)
	defer tick.Stop()
	var failing string // the repair error last logged
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events.Wake():
			events.Tend(ctx, &wg)
			continue
		case <-t.kick:
		case <-tick.C:
			t.trigger(fullAll)
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil
		}
		full := t.takePending()
		n, err := t.reconcileLocked(full)
		t.mu.Unlock()
		if err != nil {
			if err.Error() != failing { // once per change, not per event
				t.log.Warn("repair failed; retrying on the next event", "err", err)
				failing = err.Error()
			}
			continue
		}
		if failing != "" {
			t.log.Info("repair succeeded after failing")
			failing = ""
		}
		if n > 0 {
			t.metrics.repairs.Add(float64(n))
			t.log.Info("repaired tunnel state", "objects", n)
		}
	}
}

// trigger asks Run for a reconcile that reads back the kinds in full.
func (t *Tunnel) trigger(full scope) {
	t.pendingMu.Lock()
	t.pending |= full
	t.pendingMu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// nftChanged notes a committed nftables transaction that touched (or may
// have touched) our table, by generation.
func (t *Tunnel) nftChanged(gen uint32) {
	t.pendingMu.Lock()
	t.nftGens = append(t.nftGens, gen)
	t.pendingMu.Unlock()
	t.trigger(0)
}

// policyChanged is nftChanged for the filter table.
func (t *Tunnel) policyChanged(gen uint32) {
	t.pendingMu.Lock()
	t.policyGens = append(t.policyGens, gen)
	t.pendingMu.Unlock()
	t.trigger(0)
}

// takePending returns what the next repair must read back. Called with mu
// held: every transaction of ours has recorded its generation by then, so
// our own changes are told apart from someone else's.
func (t *Tunnel) takePending() scope {
	t.pendingMu.Lock()
	defer t.pendingMu.Unlock()
	full := t.pending
	// A stream reports set element changes of any table (the kernel's
	// element events do not name it), so a generation of either table's
	// own transactions is not a foreign change to the other.
	ours := func(g uint32) bool { return t.nat.madeGeneration(g) || t.filter.madeGeneration(g) }
	for _, g := range t.nftGens {
		if !ours(g) {
			full |= fullNAT
		}
	}
	for _, g := range t.policyGens {
		if !ours(g) {
			full |= fullPolicy
		}
	}
	t.pending, t.nftGens, t.policyGens = 0, nil, nil
	return full
}

// Close stops serving from this process and leaves the data path in place
// for the next start: kernel WireGuard keeps forwarding, a userspace link
// keeps its routes and NAT and resumes when the next process attaches.
func (t *Tunnel) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	t.nft.close()
	t.netns.Close()
	if t.contactTimer != nil {
		t.contactTimer.Stop()
	}
	if t.link != nil {
		t.link.close()
	}
	t.wg.Close()
	return nil
}

// Suspend removes everything the tunnel owns on this host and keeps it
// away, repairs included, until Resume; Apply goes on recording the
// desired state meanwhile. An agent whose replica may no longer be the
// active one stops forwarding this way without stopping.
func (t *Tunnel) Suspend() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.suspended = true
	if t.link != nil && !t.closed {
		t.link.close()
		t.link = nil
	}
	if err := Cleanup(t.cfg); err != nil {
		return fmt.Errorf("suspend the data path: %w", err)
	}
	t.log.Info("data path suspended: link, routes and nftables tables removed")
	return nil
}

// Resume brings the data path back as last applied, after Suspend.
func (t *Tunnel) Resume() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.suspended || t.closed {
		return nil
	}
	t.suspended = false
	t.wgApplied = nil
	t.rt.invalidate()
	t.nat.invalidate()
	if _, err := t.reconcileLocked(fullAll); err != nil {
		return fmt.Errorf("resume the data path: %w", err)
	}
	t.log.Info("data path resumed")
	return nil
}

// Cleanup closes the tunnel and removes everything it owns on this host.
func (t *Tunnel) Cleanup() error {
	t.Close()
	return Cleanup(t.cfg)
}

// Cleanup removes every object a tunnel with this config owns on this host:
// the link (only if tagged ours), our routes through it, our nftables
// table and a stale control socket. Routes with our protocol on any other
// link are not ours. It touches nothing else and is safe to repeat.
func Cleanup(cfg Config) error {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("tunnel config: %w", err)
	}
	var errs []error
	if link, ok, err := ourLink(cfg.Interface); err != nil {
		errs = append(errs, err)
	} else if ok {
		rt := &routeTable{table: cfg.RouteTable, protocol: cfg.RouteProtocol}
		if err := rt.removeAll(link.Attrs().Index); err != nil {
			errs = append(errs, err)
		}
	}
	nft := &nftSession{ns: netns.None()}
	defer nft.close()
	if err := (&natTable{name: cfg.NFTable, nft: nft}).remove(); err != nil {
		errs = append(errs, err)
	}
	if err := (&filterTable{name: PolicyTable(cfg.NFTable), nft: nft}).remove(); err != nil {
		errs = append(errs, err)
	}
	if err := removeLink(cfg.Interface); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func cloneDesired(d Desired) Desired {
	out := Desired{Networks: append([]netip.Prefix(nil), d.Networks...), HostSource: d.HostSource}
	for _, p := range d.Peers {
		p.Views = append([]View(nil), p.Views...)
		p.ViewsOfMe = append([]View(nil), p.ViewsOfMe...)
		if p.Segregated != nil {
			s := p.Segregated.Normal()
			p.Segregated = &s
		}
		out.Peers = append(out.Peers, p)
	}
	return out
}

// MTU is the WireGuard link's MTU.
func (t *Tunnel) MTU() int { return t.mtu }
