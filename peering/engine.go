package peering

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Policy decides what happens to a Peer whose spec says nothing.
type Policy string

const (
	// PolicyAuto connects every member of the federation.
	PolicyAuto Policy = "auto"
	// PolicyManual connects only Peers whose spec accepts networking.
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

// Member is a federation member as discovery reports it.
type Member struct {
	ClusterID string
	// PublicKey is the member's identity key from its verified record.
	PublicKey ed25519.PublicKey
	// Gossip is the member's gossip address.
	Gossip string
	// Alive is false once the member failed or left.
	Alive bool
	// Sources say what found the member (mdns, dns, seed, gossip).
	Sources []string
}

// Ledger is what peering needs of the ipam ledger (*ipam.Ledger).
type Ledger interface {
	SyncPeer(peer string, remotes []netip.Prefix) ([]ipam.View, error)
	Views(peer string) []ipam.View
	RecordTheirView(peer string, mine, theirs netip.Prefix) error
	TheirViews(peer string) []ipam.TheirView
	ReleasePeer(peer string) error
	PeerState(peer string) ([]byte, error)
	PutPeerState(peer string, value []byte) error
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

// StatusWriter publishes Peer objects. Write creates the Peer when missing
// and updates its status; the engine calls it from its own goroutine.
type StatusWriter interface {
	Write(ctx context.Context, id, name string, status v1alpha1.PeerStatus) error
}

// Config is what an Engine needs.
type Config struct {
	Identity identity.Identity
	// Name is this cluster's human name.
	Name   string
	Policy Policy
	// Networks are this cluster's real ranges, announced to peers.
	Networks []netip.Prefix
	// Endpoint is this cluster's WireGuard endpoint.
	Endpoint netip.AddrPort

	Ledger    Ledger
	Dataplane Dataplane
	Transport Transport
	Status    StatusWriter

	// Keepalive is WireGuard's persistent keepalive (default 25 s); it
	// also makes the first handshake happen without traffic.
	Keepalive time.Duration
	// ResendInterval is how often the current Hello is sent again to every
	// alive member (default 5 s); a duplicate costs the receiver nothing.
	ResendInterval time.Duration
	// UnreachableGrace is how long a failed member keeps its tunnel and
	// view (default 5 min) before both are removed.
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
	if len(c.Networks) == 0 {
		return errors.New("no local networks to announce")
	}
	for _, n := range c.Networks {
		if err := canonical(n); err != nil {
			return fmt.Errorf("local network %s: %w", n, err)
		}
	}
	if !c.Endpoint.IsValid() || c.Endpoint.Port() == 0 || c.Endpoint.Addr().IsUnspecified() {
		return fmt.Errorf("WireGuard endpoint %q: want a routable address:port", c.Endpoint)
	}
	if _, err := ParsePolicy(string(c.Policy)); err != nil {
		return err
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

	inputs chan func()
	// inbox takes received messages without blocking the transport.
	inbox chan []byte

	// Owned by the Run goroutine.
	peers        map[string]*peer
	gen          uint64
	applied      *tunnel.Desired
	candidate    *tunnel.Desired // what applyTunnel last started from
	candidateKey tunnel.Key
	applyErr     error
	stats        map[string]tunnel.PeerStatus
	senders      map[string]*sender
	early        map[string]earlyMessage
	statusQ      *statusQueue
	ctx          context.Context
	readyOnce    sync.Once
	ready        chan struct{}
	stopped      chan struct{}
}

// peer is the engine's state about one other cluster.
type peer struct {
	id     string
	member *Member
	// goneSince is when the member stopped being alive (or, for peers
	// restored from the ledger, when this agent started).
	goneSince time.Time
	// released: the grace period ran out and the view went to quarantine.
	released bool

	// From the Peer object.
	networking v1alpha1.Networking
	// resetUntil: the Peer object was deleted; deny until then, so the
	// other side tears down too, then recreate it.
	resetUntil time.Time

	// The last Hello accepted from the peer, and its signed payload.
	hello   *Hello
	payload []byte

	myViews    []ipam.View
	viewsFor   []netip.Prefix // the networks myViews were made for
	theirOK    bool           // their views of all my networks are recorded
	viewsErr   error
	out        *Hello // what we last sealed for the peer
	outMsg     []byte
	configured time.Time // when the peer entered the tunnel
	// tunnelErr says why the peer was left out of the data path, which
	// then serves the others (a duplicate key, an overlap).
	tunnelErr   error
	lastRefusal error
}

// New checks cfg and prepares an Engine; Run starts it.
func New(cfg Config) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("peering config: %w", err)
	}
	e := &Engine{
		cfg: cfg, log: cfg.Logger.With("component", "peering"), self: cfg.Identity.ClusterID(),
		metrics: newMetrics(cfg.Metrics),
		inputs:  make(chan func(), 256), inbox: make(chan []byte, 1024),
		peers: map[string]*peer{}, stats: map[string]tunnel.PeerStatus{}, senders: map[string]*sender{},
		early: map[string]earlyMessage{},
		ready: make(chan struct{}), stopped: make(chan struct{}),
	}
	return e, nil
}

// Ready is closed once the engine has restored its state and applied the
// data path it found in the ledger.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// MemberChanged reports a member's state from discovery.
func (e *Engine) MemberChanged(m Member) {
	e.input(func() { e.memberChanged(m) })
}

// SpecChanged reports a Peer object's spec; exists is false when it was
// deleted.
func (e *Engine) SpecChanged(id string, networking v1alpha1.Networking, exists bool) {
	e.input(func() { e.specChanged(id, networking, exists) })
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

func (e *Engine) input(f func()) {
	select {
	case e.inputs <- f:
	case <-e.done():
	}
}

// done is closed when Run has returned.
func (e *Engine) done() <-chan struct{} { return e.stopped }

// Run negotiates until ctx ends. It leaves the data path as it is: a
// restarted agent adopts it.
func (e *Engine) Run(ctx context.Context) error {
	e.ctx = ctx
	defer close(e.stopped)
	if err := e.restore(); err != nil {
		return err
	}
	e.reconcile()
	e.readyOnce.Do(func() { close(e.ready) })
	resend := time.NewTicker(e.cfg.ResendInterval)
	defer resend.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	statsEvery := 0
	for {
		select {
		case <-ctx.Done():
			for _, s := range e.senders {
				s.stop()
			}
			return nil
		case f := <-e.inputs:
			f()
		case msg := <-e.inbox:
			e.receive(msg)
		case <-resend.C:
			e.resendAll()
		case <-tick.C:
			// Poll tunnel statistics every second while something is
			// settling, every 5 s otherwise.
			statsEvery++
			if statsEvery >= 5 || e.settling() {
				statsEvery = 0
				e.refreshStats()
			}
		}
		e.drain()
		e.reconcile()
	}
}

// drain handles what queued up meanwhile, so one reconcile covers a burst.
func (e *Engine) drain() {
	for range 64 {
		select {
		case f := <-e.inputs:
			f()
		case msg := <-e.inbox:
			e.receive(msg)
		default:
			return
		}
	}
}

func (e *Engine) peer(id string) *peer {
	p, ok := e.peers[id]
	if !ok {
		p = &peer{id: id}
		e.peers[id] = p
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
	p := e.peer(m.ClusterID)
	wasAlive := p.member != nil && p.member.Alive
	mm := m
	p.member = &mm
	switch {
	case m.Alive && !wasAlive:
		p.goneSince, p.released = time.Time{}, false
		e.log.Info("member alive", "peer", m.ClusterID, "gossip", m.Gossip)
		e.send(p, true) // introduce ourselves at once
		if early, ok := e.early[m.ClusterID]; ok {
			delete(e.early, m.ClusterID)
			e.receive(early.msg)
		}
	case !m.Alive && wasAlive:
		p.goneSince = e.cfg.Now()
		e.log.Info("member unreachable", "peer", m.ClusterID, "grace", e.cfg.UnreachableGrace)
	}
}

func (e *Engine) specChanged(id string, networking v1alpha1.Networking, exists bool) {
	if id == e.self || identity.ValidateClusterID(id) != nil {
		return
	}
	p := e.peer(id)
	if !exists {
		// Deleting the Peer resets the peering: deny long enough for the
		// other side to tear down, then the object comes back per policy.
		p.networking = ""
		p.resetUntil = e.cfg.Now().Add(e.resetHold())
		if e.statusQ != nil {
			e.statusQ.forget(id)
		}
		e.log.Info("Peer object deleted: resetting the peering", "peer", id)
		return
	}
	if p.networking != networking {
		e.log.Info("Peer networking changed", "peer", id, "networking", networking)
	}
	p.networking = networking
}

func (e *Engine) resetHold() time.Duration { return 2 * time.Second }

// decision is this side's choice about p.
func (e *Engine) decision(p *peer) Decision {
	if e.cfg.Now().Before(p.resetUntil) {
		return Deny
	}
	switch p.networking {
	case v1alpha1.NetworkingDeny:
		return Deny
	case v1alpha1.NetworkingAccept:
		return Accept
	}
	if e.cfg.Policy == PolicyAuto {
		return Accept
	}
	return Pending
}

// receive verifies and records one message.
func (e *Engine) receive(msg []byte) {
	s, err := Parse(msg)
	if err != nil {
		e.refuse("", err)
		return
	}
	h := &s.Hello
	if h.To != e.self {
		e.refuse(h.From, fmt.Errorf("%w: for %s", ErrMisdirected, h.To))
		return
	}
	p, known := e.peers[h.From]
	if !known || p.member == nil {
		// Only members verified by discovery are heard. A message can
		// overtake the member's join event, so it waits (bounded) for it.
		e.holdEarly(h.From, msg)
		return
	}
	if err := s.Verify(p.member.PublicKey); err != nil {
		e.refuse(h.From, err)
		return
	}
	if p.hello != nil {
		switch {
		case h.Generation < p.hello.Generation:
			e.refuse(h.From, fmt.Errorf("%w: generation %d, already have %d", ErrReplayed, h.Generation, p.hello.Generation))
			return
		case h.Generation == p.hello.Generation:
			if !s.SameAs(p.payload) {
				e.refuse(h.From, fmt.Errorf("%w: a different message with generation %d", ErrReplayed, h.Generation))
			}
			return // a resend: nothing new
		}
	}
	p.hello, p.payload = h, slices.Clone(s.Payload())
	e.metrics.accepted.Inc()
	if err := e.persist(p, msg); err != nil {
		e.log.Error("cannot persist peer statement", "peer", p.id, "err", err)
	}
	e.log.Debug("hello accepted", "peer", p.id, "generation", h.Generation, "decision", h.Decision, "views", len(h.ViewsOfYou))
	// Answer every new statement, so a peer that lost ours recovers now
	// rather than at the next resend.
	e.send(p, true)
}

// Bounds on messages held for senders discovery has not reported yet.
const (
	maxEarly  = 256
	earlyWait = 30 * time.Second
)

type earlyMessage struct {
	msg []byte
	at  time.Time
}

// holdEarly keeps the newest message of a sender that is not a known
// member yet; memberChanged replays it. Old and excess ones are dropped
// and counted.
func (e *Engine) holdEarly(from string, msg []byte) {
	now := e.cfg.Now()
	for id, m := range e.early {
		if now.Sub(m.at) > earlyWait {
			delete(e.early, id)
			e.metrics.refused.WithLabelValues("unknown_sender").Inc()
		}
	}
	if _, ok := e.early[from]; !ok && len(e.early) >= maxEarly {
		e.metrics.refused.WithLabelValues("unknown_sender").Inc()
		return
	}
	e.early[from] = earlyMessage{msg: msg, at: now}
	e.log.Debug("message from a sender not yet known as a member: held", "from", from)
}

func (e *Engine) refuse(from string, err error) {
	reason := "malformed"
	switch {
	case errors.Is(err, ErrIncompatible):
		reason = "incompatible"
	case errors.Is(err, ErrForged):
		reason = "forged"
	case errors.Is(err, ErrReplayed):
		reason = "replayed"
	case errors.Is(err, ErrMisdirected):
		reason = "misdirected"
	}
	e.metrics.refused.WithLabelValues(reason).Inc()
	if p, ok := e.peers[from]; ok {
		p.lastRefusal = err
	}
	e.log.Warn("peering message refused", "from", from, "reason", reason, "err", err)
}

// persistedPeer is what the ledger keeps per peer: the last accepted
// message (so a restart restores the data path at once and refuses
// replays of older ones).
type persistedPeer struct {
	Message []byte `json:"message"`
}

func (e *Engine) persist(p *peer, msg []byte) error {
	b, err := json.Marshal(persistedPeer{Message: msg})
	if err != nil {
		return err
	}
	return e.cfg.Ledger.PutPeerState(p.id, b)
}

// restore loads the generation counter and the last statement accepted
// from every peer: all of them keep refusing replays of older statements,
// and those that had views get their tunnel configured as before the
// restart, without waiting for discovery.
func (e *Engine) restore() error {
	b, err := e.cfg.Ledger.LoadOrCreateKey(generationKey, func() ([]byte, error) { return make([]byte, 8), nil })
	if err != nil {
		return fmt.Errorf("load peering generation: %w", err)
	}
	if len(b) == 8 {
		e.gen = binary.BigEndian.Uint64(b)
	}
	ids, err := e.cfg.Ledger.PeersWithState()
	if err != nil {
		return err
	}
	hadViews := map[string]bool{}
	for _, v := range e.cfg.Ledger.Views("") {
		hadViews[v.Peer] = true
	}
	now := e.cfg.Now()
	for _, id := range ids {
		raw, err := e.cfg.Ledger.PeerState(id)
		if err != nil {
			continue
		}
		var st persistedPeer
		if json.Unmarshal(raw, &st) != nil {
			e.log.Warn("ignoring unreadable stored peer state", "peer", id)
			continue
		}
		s, err := Parse(st.Message)
		if err != nil || s.Hello.To != e.self || s.Hello.From != id {
			e.log.Warn("ignoring stored peer statement", "peer", id, "err", err)
			continue
		}
		p := e.peer(id)
		p.hello, p.payload = &s.Hello, slices.Clone(s.Payload())
		// Not known alive yet. Peers that had views keep their data path
		// for the grace period; the others wait for discovery.
		p.goneSince = now
		if !hadViews[id] {
			p.goneSince = now.Add(-e.cfg.UnreachableGrace)
		}
		e.log.Info("restored peer from the ledger", "peer", id, "generation", s.Hello.Generation, "dataPath", hadViews[id])
	}
	return nil
}

const generationKey = "peering-generation"

// nextGeneration returns a new generation, larger than any issued before,
// also across restarts (it is stored) and clock steps (it only grows).
func (e *Engine) nextGeneration() (uint64, error) {
	g := max(e.gen+1, uint64(e.cfg.Now().UnixNano()))
	b := binary.BigEndian.AppendUint64(nil, g)
	if err := e.cfg.Ledger.PutKey(generationKey, b); err != nil {
		return 0, fmt.Errorf("store peering generation: %w", err)
	}
	e.gen = g
	return g, nil
}

// reconcile brings views, messages, the data path and statuses in line
// with the current state.
func (e *Engine) reconcile() {
	now := e.cfg.Now()
	for _, p := range e.peers {
		e.reconcileViews(p, now)
		e.send(p, false)
	}
	e.applyTunnel()
	e.writeStatuses()
}

// wanted reports whether p should have views and a tunnel now.
func (e *Engine) wanted(p *peer, now time.Time) bool {
	if p.hello == nil || p.hello.Decision != Accept || e.decision(p) != Accept {
		return false
	}
	if p.member != nil && p.member.Alive {
		return true
	}
	return !p.goneSince.IsZero() && now.Sub(p.goneSince) < e.cfg.UnreachableGrace
}

func (e *Engine) reconcileViews(p *peer, now time.Time) {
	if !e.wanted(p, now) {
		if len(p.myViews) > 0 || len(e.cfg.Ledger.TheirViews(p.id)) > 0 || len(e.cfg.Ledger.Views(p.id)) > 0 {
			if err := e.cfg.Ledger.ReleasePeer(p.id); err != nil {
				e.log.Error("cannot release peer views", "peer", p.id, "err", err)
				return
			}
			e.log.Info("views released to quarantine", "peer", p.id, "decision", e.decision(p), "theirDecision", decisionOf(p.hello))
			if p.member == nil || !p.member.Alive {
				p.released = true
			}
		}
		p.myViews, p.viewsFor, p.theirOK, p.viewsErr = nil, nil, false, nil
		return
	}
	if !slices.Equal(p.viewsFor, p.hello.Networks) || len(p.myViews) == 0 {
		views, err := e.cfg.Ledger.SyncPeer(p.id, p.hello.Networks)
		if err != nil {
			p.viewsErr = fmt.Errorf("allocate views of %s: %w", p.id, err)
			p.myViews, p.viewsFor = nil, nil
			e.log.Error("cannot give the peer a view", "peer", p.id, "err", err)
		} else {
			p.myViews, p.viewsFor, p.viewsErr = views, slices.Clone(p.hello.Networks), nil
		}
	}
	if err := e.checkEndpoints(p); err != nil {
		p.viewsErr, p.theirOK = err, false
		return
	}
	p.theirOK = false
	if len(p.hello.ViewsOfYou) == 0 {
		return
	}
	for _, mine := range e.cfg.Networks {
		i := slices.IndexFunc(p.hello.ViewsOfYou, func(v ViewClaim) bool { return v.Range == mine })
		if i < 0 {
			// The peer answered an older statement of ours; ours is on its
			// way, so this settles by itself.
			return
		}
		if err := e.cfg.Ledger.RecordTheirView(p.id, mine, p.hello.ViewsOfYou[i].As); err != nil {
			p.viewsErr = err
			e.log.Warn("inconsistent view claim refused", "peer", p.id, "err", err)
			return
		}
	}
	if p.viewsErr == nil {
		p.theirOK = true
	}
}

// checkEndpoints refuses to route a peer's range that holds a gateway
// address (ours or another peer's endpoint): WireGuard's own packets would
// go into the tunnel.
func (e *Engine) checkEndpoints(p *peer) error {
	for _, v := range p.myViews {
		if v.View.Contains(e.cfg.Endpoint.Addr()) {
			return fmt.Errorf("its range %s (seen as %s) holds this gateway's address %s", v.Remote, v.View, e.cfg.Endpoint.Addr())
		}
		for _, o := range e.peers {
			if o != p && o.hello != nil && v.View.Contains(o.hello.Endpoint.Addr()) {
				return fmt.Errorf("its range %s (seen as %s) holds the gateway address %s of peer %s", v.Remote, v.View, o.hello.Endpoint.Addr(), o.id)
			}
		}
	}
	return nil
}

func decisionOf(h *Hello) Decision {
	if h == nil {
		return ""
	}
	return h.Decision
}

// outgoing is the Hello p should have from us now.
func (e *Engine) outgoing(p *peer) *Hello {
	h := &Hello{
		Protocol: ProtocolVersion, From: e.self, To: p.id, Name: e.cfg.Name,
		Networks: slices.Clone(e.cfg.Networks), Endpoint: e.cfg.Endpoint, Decision: e.decision(p),
	}
	key := e.cfg.Dataplane.PublicKey()
	h.WireGuardKey = key[:]
	if h.Decision == Accept && len(p.myViews) > 0 {
		for _, v := range p.myViews {
			h.ViewsOfYou = append(h.ViewsOfYou, ViewClaim{Range: v.Remote, As: v.View})
		}
	}
	return h
}

// send seals and sends a new Hello for p when its content changed. With
// again, it also sends the current one when nothing changed: to a member
// that just appeared, or in answer to a new statement. Reconciles, which
// run after every input, must not resend: a duplicate received would
// trigger a reconcile that resends, a loop across the federation.
func (e *Engine) send(p *peer, again bool) {
	if p.member == nil || !p.member.Alive {
		return
	}
	h := e.outgoing(p)
	if p.out != nil {
		prev := *p.out
		prev.Generation = 0
		if reflect.DeepEqual(&prev, h) {
			if again {
				e.sender(p.id).post(p.outMsg)
			}
			return
		}
	}
	g, err := e.nextGeneration()
	if err != nil {
		e.log.Error("cannot issue a new statement", "err", err)
		return
	}
	h.Generation = g
	msg, err := Seal(h, e.cfg.Identity)
	if err != nil {
		e.log.Error("cannot seal a statement", "peer", p.id, "err", err)
		return
	}
	unsealed := *h
	unsealed.Generation = 0
	p.out, p.outMsg = &unsealed, msg
	e.metrics.sent.Inc()
	e.sender(p.id).post(msg)
}

func (e *Engine) resendAll() {
	for _, p := range e.peers {
		if p.outMsg != nil && p.member != nil && p.member.Alive {
			e.sender(p.id).post(p.outMsg)
		}
	}
}

// applyTunnel computes the desired data path and applies it when it
// differs from what was last applied.
func (e *Engine) applyTunnel() {
	now := e.cfg.Now()
	d := tunnel.Desired{Networks: slices.Clone(e.cfg.Networks)}
	for _, p := range e.peers {
		if !e.wanted(p, now) || len(p.myViews) == 0 || !p.theirOK {
			p.configured, p.tunnelErr = time.Time{}, nil
			continue
		}
		tp := tunnel.Peer{ClusterID: p.id, Endpoint: p.hello.Endpoint, Keepalive: e.cfg.Keepalive}
		copy(tp.PublicKey[:], p.hello.WireGuardKey)
		for _, v := range p.myViews {
			tp.Views = append(tp.Views, tunnel.View{Real: v.Remote, As: v.View})
		}
		for _, v := range e.cfg.Ledger.TheirViews(p.id) {
			if slices.Contains(e.cfg.Networks, v.Mine) {
				tp.ViewsOfMe = append(tp.ViewsOfMe, tunnel.View{Real: v.Mine, As: v.Theirs})
			}
		}
		d.Peers = append(d.Peers, tp)
	}
	// Most reconciles change nothing: skip validating and comparing the
	// whole data path then.
	slices.SortFunc(d.Peers, func(a, b tunnel.Peer) int { return compareStrings(a.ClusterID, b.ClusterID) })
	own := e.cfg.Dataplane.PublicKey() // isolate refuses peers using it
	if e.candidate != nil && e.applyErr == nil && e.candidateKey == own && reflect.DeepEqual(*e.candidate, d) {
		return
	}
	e.candidate, e.candidateKey = &tunnel.Desired{Networks: d.Networks, Peers: slices.Clone(d.Peers)}, own
	d = e.isolate(d)
	for _, tp := range d.Peers {
		if p := e.peers[tp.ClusterID]; p.configured.IsZero() {
			p.configured = now
		}
	}
	slices.SortFunc(d.Peers, func(a, b tunnel.Peer) int { return compareStrings(a.ClusterID, b.ClusterID) })
	if e.applied != nil && e.applyErr == nil && reflect.DeepEqual(*e.applied, d) {
		return
	}
	start := time.Now()
	err := e.cfg.Dataplane.Apply(e.ctx, d)
	e.metrics.applySeconds.Observe(time.Since(start).Seconds())
	e.applied, e.applyErr = &d, err
	if err != nil {
		e.metrics.applyErrors.Inc()
		e.log.Error("cannot apply the data path", "peers", len(d.Peers), "err", err)
		return
	}
	e.log.Info("data path applied", "peers", len(d.Peers), "took", time.Since(start).Round(time.Microsecond))
	e.refreshStats()
}

// isolate keeps one peer's bad contribution (a WireGuard key another peer
// or this cluster uses, views that collide) from failing the whole data
// path: when d does not validate, peers are added one by one and those that
// break it are left out, with the reason on their Peer.
func (e *Engine) isolate(d tunnel.Desired) tunnel.Desired {
	own := e.cfg.Dataplane.PublicKey()
	ok := tunnel.Desired{Networks: d.Networks}
	whole := d.Validate() == nil
	// Peers configured longest first: a newcomer that collides with an
	// established peer (say, by copying its public key) is the one left out.
	since := func(tp tunnel.Peer) time.Time {
		if c := e.peers[tp.ClusterID].configured; !c.IsZero() {
			return c
		}
		return time.Unix(1<<40, 0)
	}
	slices.SortStableFunc(d.Peers, func(a, b tunnel.Peer) int {
		if c := since(a).Compare(since(b)); c != 0 {
			return c
		}
		return compareStrings(a.ClusterID, b.ClusterID)
	})
	for _, tp := range d.Peers {
		p := e.peers[tp.ClusterID]
		p.tunnelErr = nil
		if tp.PublicKey == own {
			p.tunnelErr = errors.New("announces this cluster's own WireGuard key")
		} else if !whole {
			try := ok
			try.Peers = append(slices.Clone(ok.Peers), tp)
			if err := try.Validate(); err != nil {
				p.tunnelErr = err
			}
		}
		if p.tunnelErr != nil {
			p.configured = time.Time{}
			e.log.Warn("peer left out of the data path", "peer", tp.ClusterID, "err", p.tunnelErr)
			continue
		}
		ok.Peers = append(ok.Peers, tp)
	}
	return ok
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (e *Engine) refreshStats() {
	st, err := e.cfg.Dataplane.Status()
	if err != nil {
		e.log.Debug("tunnel status", "err", err)
		return
	}
	clear(e.stats)
	for _, s := range st {
		e.stats[s.ClusterID] = s
	}
}

// settling reports whether some peer is configured but not yet connected.
func (e *Engine) settling() bool {
	for _, p := range e.peers {
		if !p.configured.IsZero() && e.phase(p) != v1alpha1.PhaseConnected {
			return true
		}
	}
	return false
}

// sender delivers messages to one peer, keeping only the newest pending.
type sender struct {
	wake    chan struct{}
	mu      sync.Mutex
	pending []byte
	cancel  context.CancelFunc
}

func (e *Engine) sender(id string) *sender {
	if s, ok := e.senders[id]; ok {
		return s
	}
	ctx, cancel := context.WithCancel(e.ctx)
	s := &sender{wake: make(chan struct{}, 1), cancel: cancel}
	e.senders[id] = s
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			}
			s.mu.Lock()
			msg := s.pending
			s.pending = nil
			s.mu.Unlock()
			if msg == nil {
				continue
			}
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			err := e.cfg.Transport.Send(sctx, id, msg)
			scancel()
			if err != nil && ctx.Err() == nil {
				e.metrics.sendErrors.Inc()
				e.log.Debug("send to peer failed; will resend", "peer", id, "err", err)
			}
		}
	}()
	return s
}

func (s *sender) post(msg []byte) {
	s.mu.Lock()
	s.pending = msg
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sender) stop() { s.cancel() }
