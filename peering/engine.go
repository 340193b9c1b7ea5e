package peering

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Policy decides what happens to a peer whose spec says nothing.
type Policy string

const (
	// PolicyAuto connects every member of the federation.
	PolicyAuto Policy = "auto"
	// PolicyManual connects only peers whose spec accepts networking.
	PolicyManual Policy = "manual"
)

// ParsePolicy parses --peering.
func ParsePolicy(s string) (Policy, error) {
	switch Policy(s) {
	case PolicyAuto, PolicyManual:
		return Policy(s), nil
	}
	return "", fmt.Errorf("peering policy %q: want auto or manual", s)
}

// Networking is the admin's wish about networking with one peer.
type Networking string

const (
	// NetworkingDefault follows the Policy.
	NetworkingDefault Networking = ""
	NetworkingAccept  Networking = "Accept"
	NetworkingDeny    Networking = "Deny"
)

// Spec is what the admin decided about one peer (a Peer object's spec).
type Spec struct {
	Networking Networking
	// Generation names this spec (the object's metadata.generation); the
	// state the engine emits after acting on it carries it.
	Generation int64
}

// Member is a federation member as discovery reports it.
type Member struct {
	ClusterID string
	// PublicKey is the member's identity key from its verified record.
	PublicKey ed25519.PublicKey
	// Gossip is the member's gossip address.
	Gossip string
	// Sources are the discovery sources that found the member (mdns, dns,
	// seed, gossip).
	Sources []string
	// Alive is false once the member failed or left.
	Alive bool
	// OutboundOnly: the member's signed record says nobody can reach its
	// gateway first (it is behind NAT). Its WireGuard endpoint is learned
	// from its handshakes, not taken from its statement.
	OutboundOnly bool
}

// Ledger is what peering needs of the ipam ledger (*ipam.Ledger). A
// reconcile makes its writes (statements, views, claims) in one Batch.
type Ledger interface {
	Batch(fn func(ipam.Batch) error) error
	Views(peer string) []ipam.View
	TheirViews(peer string) []ipam.TheirView
	PeerState(peer string) ([]byte, error)
	PeersWithState() ([]string, error)
	LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error)
	PutKey(name string, value []byte) error
}

// Dataplane is what peering needs of the tunnel (*tunnel.Tunnel).
type Dataplane interface {
	Apply(ctx context.Context, d tunnel.Desired) error
	Status() ([]tunnel.PeerStatus, error)
	PublicKey() tunnel.Key
}

// Transport carries sealed messages to a member. Send may block while it
// connects; the engine calls it from one goroutine per peer.
type Transport interface {
	Send(ctx context.Context, to string, msg []byte) error
}

// Publisher receives the engine's peer states (peerapi writes them to Peer
// objects). The engine calls it from its own goroutine: it must not block.
type Publisher interface {
	// Publish hands over the newest state of a peer. A state is handed
	// over once per change.
	Publish(s PeerState)
	// Withdraw drops what was handed over for the peer and is not yet
	// written: its Peer object was deleted and stays so until the engine
	// publishes the peer again.
	Withdraw(id string)
	// Retire says the peer is gone for good and its Peer object has no
	// use left: an alive member carries its name (the same cluster back
	// under a new identity, its state directory lost), or it never said
	// who it was (a member seen only in passing). The object may go,
	// unless an admin decided something in it; why is for the log.
	Retire(id, why string)
}

// GrantReceiver takes the sealed grants peers send this cluster (the
// consumer side of offload/grant opens and keeps them). The engine calls
// it from its own goroutine: it must not block.
type GrantReceiver interface {
	// GrantReceived hands over the sealed grant in a statement accepted
	// from the peer from, whose identity key is key: once per new content
	// (a resend, or a new statement with the same grant, calls nothing),
	// and again after a restart of this agent, since what the receiver
	// kept is its own to know.
	GrantReceived(from string, key ed25519.PublicKey, sealed []byte)
}

// Config is what an Engine needs.
type Config struct {
	Identity identity.Identity
	// Name is this cluster's human name.
	Name string
	// Labels are this cluster's labels, announced to every peer
	// (CheckLabels).
	Labels map[string]string
	Policy Policy
	// Networks are this cluster's real ranges, announced to peers, at
	// start; SetNetworks changes them.
	Networks []netip.Prefix
	// Endpoint is this cluster's WireGuard endpoint.
	Endpoint netip.AddrPort
	// OutboundOnly: nobody can reach this cluster's gateway first (it is
	// behind NAT). It initiates every tunnel, and cannot peer with a
	// member that is outbound only too.
	OutboundOnly bool

	Ledger    Ledger
	Dataplane Dataplane
	Transport Transport
	// Publisher, when set, receives every peer's state as it changes.
	Publisher Publisher
	// Grants, when set, receives the grants peers send.
	Grants GrantReceiver

	// Keepalive is WireGuard's persistent keepalive (default 25 s); it
	// also makes the first handshake happen without traffic.
	Keepalive time.Duration
	// ResendInterval is how often the current Hello is sent again to every
	// alive member (default 5 s); a duplicate costs the receiver nothing.
	ResendInterval time.Duration
	// UnreachableGrace is how long a failed member keeps its tunnel and
	// view (default 5 min) before both are removed and the peer forgotten.
	UnreachableGrace time.Duration
	// HandshakeTimeout: a tunnel without a handshake for this long is
	// Degraded (default 3 min, WireGuard's reject-after time).
	HandshakeTimeout time.Duration

	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// Now is the clock (tests).
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Keepalive == 0 {
		c.Keepalive = 25 * time.Second
	}
	if c.ResendInterval == 0 {
		c.ResendInterval = 5 * time.Second
	}
	if c.UnreachableGrace == 0 {
		c.UnreachableGrace = 5 * time.Minute
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 3 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Policy == "" {
		c.Policy = PolicyAuto
	}
}

func (c *Config) validate() error {
	if c.Identity.Private == nil {
		return errors.New("no identity")
	}
	if c.Ledger == nil || c.Dataplane == nil || c.Transport == nil {
		return errors.New("ledger, dataplane and transport are required")
	}
	if err := checkNetworks(c.Networks); err != nil {
		return err
	}
	if !c.Endpoint.IsValid() || c.Endpoint.Port() == 0 || c.Endpoint.Addr().IsUnspecified() {
		return fmt.Errorf("WireGuard endpoint %q: want a routable address:port", c.Endpoint)
	}
	if _, err := ParsePolicy(string(c.Policy)); err != nil {
		return err
	}
	if err := CheckLabels(c.Labels); err != nil {
		return fmt.Errorf("cluster labels: %w", err)
	}
	return nil
}

// Engine runs the negotiation with every member. All state is owned by one
// goroutine (Run); the exported methods hand it inputs.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	self    string
	metrics *metrics

	// inputs run on the Run goroutine; each says whether it changed
	// anything a reconcile acts on.
	inputs chan func() bool
	// inbox takes received messages without blocking the transport.
	inbox chan []byte

	// Owned by the Run goroutine.
	peers map[string]*peer
	// specs are the admin's decisions, by peer; they outlive the peers'
	// runtime state, as their objects do.
	specs map[string]Spec
	// grants are the sealed grants to send, by peer (SetGrant); like
	// specs they outlive the peers' runtime state.
	grants     map[string][]byte
	published  map[string]PeerState
	gen        uint64 // the last generation issued
	genCeiling uint64 // stored: no generation issued is above it
	// issueErr is the last failure to issue a statement (a full disk
	// under the ledger): logged once per change, not once per peer and
	// reconcile.
	issueErr     string
	applied      *tunnel.Desired
	candidate    *tunnel.Desired // what applyTunnel last started from
	candidateKey tunnel.Key
	applyErr     error
	stats        map[string]tunnel.PeerStatus
	early        map[string]earlyMessage
	// toPersist are statements accepted since the last ledger write, by
	// peer: a burst is written in one synced transaction.
	toPersist map[string][]byte
	ledgerErr error // the last failure to write the ledger, logged once
	ctx       context.Context

	// appliedSeq counts the data paths applied; settlingNow says whether
	// a configured peer waits for its handshake. Both tell pollStats, on
	// its own goroutine, what reads are current and how often to read.
	appliedSeq  atomic.Uint64
	settlingNow atomic.Bool
	statsKick   chan struct{}

	// senders counts running sender goroutines; Run waits for them.
	// sendersAlive counts the senders, one per alive member spoken to.
	senders      sync.WaitGroup
	sendersAlive atomic.Int64

	readyOnce sync.Once
	ready     chan struct{}
	stopped   chan struct{}
}

// peer is the engine's state about one other cluster. It exists while the
// cluster is a member, or holds a data path, or has a state left to
// publish; forget ends it.
type peer struct {
	id     string
	member *Member
	// goneSince is when the member stopped being alive (or, for peers
	// restored from the ledger, when this agent started).
	goneSince time.Time
	// resetUntil: the Peer object was deleted; deny until then, so the
	// other side tears down too, then recreate it.
	resetUntil time.Time

	// The last Hello accepted from the peer, and its signed payload.
	hello   *Hello
	payload []byte

	myViews  []ipam.View
	viewsFor []netip.Prefix // the networks myViews were made for
	theirOK  bool           // their views of all my networks are recorded
	viewsErr error
	// releaseErr is the last failure to release the views, logged once.
	releaseErr string
	// viewsRetry: allocating views failed; tried again then, or sooner
	// when the networks or views change.
	viewsRetry time.Time
	out        *Hello // what we last sealed for the peer
	outMsg     []byte
	sender     *sender // while the member is alive
	configured time.Time
	// tunnelErr says why the peer was left out of the data path, which
	// then serves the others (a duplicate key, an overlap).
	tunnelErr error
	// steps logged during this membership (steps.go).
	steps map[Step]bool
	// grantDelivered is the last grant handed to Config.Grants.
	grantDelivered []byte
	// succeededBy is the new identity this one's views went to
	// (succession.go); successionUntil is how long this one, new, waits
	// for an old identity still alive.
	succeededBy     string
	successionUntil time.Time
}

// New checks cfg and prepares an Engine; Run starts it.
func New(cfg Config) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("peering config: %w", err)
	}
	cfg.Labels = maps.Clone(cfg.Labels) // the caller's map may change; statements may not
	e := &Engine{
		cfg: cfg, log: cfg.Logger.With("component", "peering"), self: cfg.Identity.ClusterID(),
		metrics: newMetrics(cfg.Metrics, cfg.Dataplane),
		inputs:  make(chan func() bool, 256), inbox: make(chan []byte, 1024),
		peers: map[string]*peer{}, specs: map[string]Spec{}, grants: map[string][]byte{}, published: map[string]PeerState{},
		stats: map[string]tunnel.PeerStatus{}, early: map[string]earlyMessage{}, toPersist: map[string][]byte{},
		ready: make(chan struct{}), stopped: make(chan struct{}), statsKick: make(chan struct{}, 1),
	}
	return e, nil
}

// Ready is closed once the engine has restored its state and applied the
// data path it found in the ledger.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// MemberChanged reports a member's state from discovery.
func (e *Engine) MemberChanged(m Member) {
	e.input(func() bool { e.memberChanged(m); return true })
}

// SpecChanged reports the admin's spec for a peer.
func (e *Engine) SpecChanged(id string, s Spec) {
	e.input(func() bool { return e.specChanged(id, s) })
}

// SpecDeleted reports that the admin deleted a peer's object: the peering
// is reset.
func (e *Engine) SpecDeleted(id string) {
	e.input(func() bool { e.specDeleted(id); return true })
}

// SetGrant sets the sealed grant the statements to peer id carry from now
// on (nil: none); a change is sent at once, as any change of statement.
// The engine does not open it.
func (e *Engine) SetGrant(id string, sealed []byte) error {
	if err := identity.ValidateClusterID(id); err != nil {
		return fmt.Errorf("set grant: %w", err)
	}
	if id == e.self {
		return errors.New("set grant: a grant to this cluster itself")
	}
	if len(sealed) > MaxGrantSize {
		return fmt.Errorf("set grant for %s: %d bytes, over the %d a statement carries", id, len(sealed), MaxGrantSize)
	}
	sealed = slices.Clone(sealed)
	e.input(func() bool {
		if len(sealed) == 0 {
			delete(e.grants, id)
		} else {
			e.grants[id] = sealed
		}
		return true
	})
	return nil
}

// Receive hands the engine a message from the transport. It never blocks:
// when the inbox is full the message is dropped and counted, and the
// sender's next resend repairs it.
func (e *Engine) Receive(msg []byte) {
	select {
	case e.inbox <- slices.Clone(msg):
	default:
		e.metrics.refused.WithLabelValues("inbox_full").Inc()
	}
}

func (e *Engine) input(f func() bool) {
	select {
	case e.inputs <- f:
	case <-e.stopped:
	}
}

// Run negotiates until ctx ends, then waits for its senders. It leaves the
// data path as it is: a restarted agent adopts it.
func (e *Engine) Run(ctx context.Context) error {
	e.ctx = ctx
	defer close(e.stopped)
	defer e.senders.Wait()
	if err := e.restore(); err != nil {
		return err
	}
	e.reconcile()
	e.readyOnce.Do(func() { close(e.ready) })
	resend := time.NewTicker(e.cfg.ResendInterval)
	defer resend.Stop()
	// Time alone moves some states (a grace period ends, a tunnel without
	// a handshake turns Degraded): reconcile every second.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var stats sync.WaitGroup
	defer stats.Wait()
	statsCtx, stopStats := context.WithCancel(ctx)
	defer stopStats()
	stats.Go(func() { e.pollStats(statsCtx) })
	for {
		// Reconcile only after what may have changed something: at 100
		// peers a statement arrives every 50 ms, nearly all of them
		// resends, and each reconcile goes through every peer.
		changed := false
		select {
		case <-ctx.Done():
			return nil
		case f := <-e.inputs:
			changed = f()
		case msg := <-e.inbox:
			changed = e.receive(msg)
		case <-resend.C:
			e.resendAll()
		case <-tick.C:
			changed = true // time alone moves some states
		}
		if e.drain() || changed {
			e.reconcile()
			e.metrics.reconciles.Inc()
		}
		e.settlingNow.Store(e.settling())
	}
}

// drain handles what queued up meanwhile, so one reconcile covers a
// burst; it says whether any of it changed something.
func (e *Engine) drain() bool {
	changed := false
	for range 64 {
		select {
		case f := <-e.inputs:
			changed = f() || changed
		case msg := <-e.inbox:
			changed = e.receive(msg) || changed
		default:
			return changed
		}
	}
	return changed
}

// peer returns the state about id, starting it (with the last statement
// the ledger holds from id) when there is none.
func (e *Engine) peer(id string) *peer {
	p, ok := e.peers[id]
	if !ok {
		p = &peer{id: id}
		e.peers[id] = p
		e.loadStatement(p)
	}
	return p
}

func (e *Engine) memberChanged(m Member) {
	if m.ClusterID == e.self {
		return
	}
	if err := identity.ValidateClusterID(m.ClusterID); err != nil {
		e.log.Warn("ignoring member with an invalid cluster ID", "member", m.ClusterID, "err", err)
		return
	}
	if _, known := e.peers[m.ClusterID]; !known && !m.Alive {
		return // gone before it was ever seen alive: nothing to tear down
	}
	p := e.peer(m.ClusterID)
	wasAlive := p.member != nil && p.member.Alive
	mm := m
	mm.Sources = slices.Clone(m.Sources)
	p.member = &mm
	switch {
	case m.Alive && !wasAlive:
		p.goneSince = time.Time{}
		p.succeededBy = "" // alive after all: it needs views of its own
		e.log.Info("member alive", "peer", m.ClusterID, "gossip", m.Gossip)
		p.steps = nil // a new membership: its steps are logged anew
		e.stepOnce(p, StepJoined, time.Time{})
		e.deliverGrant(p) // one restored from the ledger, now that its key is known
		e.send(p, true)   // introduce ourselves at once
		if early, ok := e.early[m.ClusterID]; ok {
			delete(e.early, m.ClusterID)
			e.metrics.held.Set(float64(len(e.early)))
			e.receive(early.msg)
		}
	case !m.Alive && wasAlive:
		p.goneSince = e.cfg.Now()
		e.stopSender(p) // nothing is sent to a member that is not alive
		e.log.Info("member unreachable", "peer", m.ClusterID, "grace", e.cfg.UnreachableGrace)
	}
}

// specChanged records s; it says whether it differs from what was known
// (the Peer's status written by the publisher comes back as an update).
func (e *Engine) specChanged(id string, s Spec) bool {
	if id == e.self || identity.ValidateClusterID(id) != nil {
		return false
	}
	old, known := e.specs[id]
	if known && old == s {
		return false
	}
	if old.Networking != s.Networking {
		e.log.Info("Peer networking changed", "peer", id, "networking", s.Networking, "generation", s.Generation)
	}
	e.specs[id] = s
	return true
}

func (e *Engine) specDeleted(id string) {
	delete(e.specs, id)
	p, ok := e.peers[id]
	if !ok {
		return // a peer gone for good: its object stays deleted
	}
	// Deleting the Peer resets the peering: deny long enough for the other
	// side to tear down, then the object comes back per policy.
	p.resetUntil = e.cfg.Now().Add(e.resetHold())
	delete(e.published, id)
	if e.cfg.Publisher != nil {
		e.cfg.Publisher.Withdraw(id)
	}
	e.log.Info("Peer object deleted: resetting the peering", "peer", id)
}

func (e *Engine) resetHold() time.Duration { return 2 * time.Second }

// decision is this side's choice about p.
func (e *Engine) decision(p *peer) Decision {
	if e.cfg.Now().Before(p.resetUntil) {
		return Deny
	}
	switch e.specs[p.id].Networking {
	case NetworkingDeny:
		return Deny
	case NetworkingAccept:
		return Accept
	}
	if e.cfg.Policy == PolicyAuto {
		return Accept
	}
	return Pending
}

func decisionOf(h *Hello) Decision {
	if h == nil {
		return ""
	}
	return h.Decision
}

// reconcile brings views, messages, the data path and peer states in line
// with the current state, then forgets the peers gone for good.
func (e *Engine) reconcile() {
	now := e.cfg.Now()
	e.writeLedger(now)
	for _, p := range e.peers {
		e.send(p, false)
	}
	e.applyTunnel()
	e.publish()
	// A peer that entered the data path just now hears so at once: if it
	// waits for our first handshake initiation, it learns it went out.
	for _, p := range e.peers {
		e.send(p, false)
	}
	for _, p := range e.peers {
		if e.goneForGood(p, now) {
			why := e.retired(p)
			e.forget(p)
			if why != "" && e.cfg.Publisher != nil {
				e.log.Info("peer retired: its Peer has no use left", "peer", p.id, "why", why)
				e.cfg.Publisher.Retire(p.id, why)
			}
		}
	}
}

// retired says why p, gone for good, leaves no use for its Peer: it never
// spoke (a member seen only in passing, such as a cluster's old identity
// gossiped about while it died), or an alive member carries its name (the
// cluster back under a new identity). "" when its Peer should stay: a
// cluster gone for good is still shown as such. Names are not unique by
// construction, but two clusters of one name are a mistake the Peers
// already show; the one gone for good leaves.
func (e *Engine) retired(p *peer) string {
	if p.hello == nil {
		return "it never sent a statement"
	}
	if p.hello.Name == "" {
		return ""
	}
	for _, q := range e.peers {
		if q != p && q.member != nil && q.member.Alive && q.hello != nil && q.hello.Name == p.hello.Name {
			return fmt.Sprintf("cluster %s is back as %s", p.hello.Name, q.id)
		}
	}
	return ""
}

// goneForGood reports whether nothing is left to do about p: the member is
// not alive, its grace period is over, it holds no views, and its last
// state was published. Its statement stays in the ledger, so should it
// come back, older ones are still refused.
func (e *Engine) goneForGood(p *peer, now time.Time) bool {
	if p.member != nil && p.member.Alive || now.Before(p.resetUntil) {
		return false
	}
	if p.goneSince.IsZero() || now.Sub(p.goneSince) < e.cfg.UnreachableGrace {
		return false
	}
	return len(p.myViews) == 0 && p.configured.IsZero()
}

func (e *Engine) forget(p *peer) {
	e.stopSender(p)
	delete(e.peers, p.id)
	delete(e.published, p.id)
	delete(e.stats, p.id)
	e.log.Info("peer gone for good: forgotten", "peer", p.id)
}
