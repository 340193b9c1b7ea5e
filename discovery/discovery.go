// Package discovery finds the other clusters of a federation and keeps a
// gossip membership with them. Candidates come from mDNS on the LAN,
// DNS-SD records and seed addresses; membership is hashicorp/memberlist,
// encrypted with the federation key. Every member carries a record signed
// by its cluster identity; members whose record does not verify are kept
// out. Peering consumes the member events; discovery knows nothing of
// tunnels.
package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/identity"
)

// DefaultGossipPort is the default gossip port (UDP and TCP).
const DefaultGossipPort = 7946

// Profile selects memberlist timings.
type Profile string

const (
	// ProfileLAN is memberlist's LAN profile with faster probes and a
	// shorter suspicion (see lanConfig): a crashed member is declared
	// failed by all in about 3 s among 10 and under 5 s among 100 on an
	// unloaded machine (docs/discovery.md has the figures under load).
	ProfileLAN Profile = "lan"
	// ProfileWAN is memberlist's WAN profile unchanged.
	ProfileWAN Profile = "wan"
	// ProfileLocal is memberlist's loopback profile unchanged.
	ProfileLocal Profile = "local"
)

// lanConfig is memberlist's LAN profile with faster probes, a shorter
// suspicion and no compression. The measurements behind the numbers are
// in docs/discovery.md.
func lanConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	// Probe every 450 ms (stock: 1 s) with a 400 ms timeout and the stock
	// suspicion multiplier 4: the suspicion timeout is SuspicionMult ×
	// log10(members) probe intervals, 1.8 s at 10 members and 3.6 s at
	// 100 (stock 4 s, 8 s), reached once two other members confirm the
	// suspicion (multiplier minus 2); unconfirmed, it is 6 times that.
	// Two confirmations rather than one (multiplier 3 collapses at load
	// 20) and the notice to the suspect (notice.go) keep a stalled
	// process's members alive. A shorter timeout without the notice has
	// loaded-but-alive members declared dead by the dozen at load
	// averages of 20 to 50 (docs/benchmarks.md has today's figures).
	c.ProbeInterval = 450 * time.Millisecond
	c.ProbeTimeout = 400 * time.Millisecond
	c.SuspicionMult = 4
	// Records are keys and signatures, which LZW does not shrink (3 %),
	// while a new LZW writer per packet costs a sixth of the CPU: under
	// load that CPU is what turns late acks into false deaths.
	// Compressed packets from other members are still read.
	c.EnableCompression = false
	// Gossip stays at 200 ms to 3 members: gossiping every 100 ms
	// converges no faster once joins are followed up (see
	// candidates.joined) and, under load, costs CPU and false failures.
	return c
}

// Config is what a Discovery needs. Identity and Keys are required.
type Config struct {
	Identity identity.Identity
	// Keys is the federation keyring; Keys[0] is the primary key, used to
	// encrypt. Every key decrypts.
	Keys [][]byte

	// BindAddr is where gossip listens; default 0.0.0.0:7946. Port 0 picks
	// a free port.
	BindAddr netip.AddrPort
	// AdvertiseAddr is the gossip address other members use; default: the
	// bind address, or memberlist's pick of a private address.
	AdvertiseAddr netip.AddrPort
	// Endpoint is the peering endpoint carried in the record ("host:port").
	Endpoint string
	// OutboundOnly says nobody can reach this member first (its gateway
	// is behind NAT): the record says so, and members reach it only
	// through the connections it opens (nat.go).
	OutboundOnly bool
	// Protocol is the peering protocol version this cluster writes
	// (peering.ProtocolVersion, which the agent passes): carried in the
	// record and the mDNS advert so that it shows before any statement.
	// Required.
	Protocol uint16

	// MDNS advertises and browses on the LAN.
	MDNS bool
	// MDNSInterface restricts mDNS to one interface (name); default: the
	// system's multicast interface.
	MDNSInterface string
	// MDNSHostName is the host name in the advert; default
	// "<cluster ID>.local." (the system host name often does not resolve
	// inside a network namespace).
	MDNSHostName string
	// BrowseInterval is the time between mDNS browses; default 10 s.
	BrowseInterval time.Duration

	// DNSDomains are searched for _flotilla._udp SRV and PTR records.
	DNSDomains []string
	// DNSServer is the DNS server ("host:port"); default: the first
	// nameserver of /etc/resolv.conf.
	DNSServer string
	// ResolveInterval is the time between DNS-SD lookups; default 30 s.
	ResolveInterval time.Duration

	// Seeds are "host:port" gossip addresses joined with backoff.
	Seeds []string
	// RetryMin and RetryMax bound the join backoff; defaults 1 s and 15 s.
	// A member's address is rechecked every RetryMax.
	RetryMin, RetryMax time.Duration

	// Profile selects memberlist timings; default LAN.
	Profile Profile
	// NoSuspicionNotice turns off the notice a member sends to a member
	// it suspects (notice.go), which cuts false deaths under load by more
	// than half (docs/discovery.md).
	NoSuspicionNotice bool
	// Tune, if set, adjusts the memberlist configuration last (tests).
	Tune func(*memberlist.Config)
	// Streams bound the gossip streams other hosts open; zero fields
	// take their defaults.
	Streams StreamLimits
	// Packets bound the gossip packets one source sends; zero fields
	// take their defaults.
	Packets PacketLimits

	// OnMessage receives the messages other members send with Send. It is
	// called on memberlist's network goroutines and must not block: hand
	// the message to a queue and return. msg is the callee's to keep.
	// Only holders of the federation key can send one, but the message
	// itself does not say which member sent it: authenticate the content
	// (peering signs its messages).
	OnMessage func(msg []byte)
	// OnServices receives the messages other members send with
	// SendServices (the Multi-Cluster Services API's exports), under
	// OnMessage's rules: it must not block, msg is its to keep, and the
	// content must authenticate itself.
	OnServices func(msg []byte)

	// Serials keeps this cluster's record serial across restarts, so the
	// serial only grows even when the clock steps back (*ipam.Ledger).
	// Without one it lives in memory only (tests).
	Serials SerialStore
	// ForgetAfter is how long the highest serial of a departed member is
	// remembered: until then a replay of one of its older records is
	// refused; after it the memory is freed. Default 24 h.
	ForgetAfter time.Duration
	// Now is the clock of serials and member ages; default time.Now.
	Now func() time.Time

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// SerialStore is what discovery needs of the ledger (*ipam.Ledger) to keep
// its record serial.
type SerialStore interface {
	LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error)
	PutKey(name string, value []byte) error
}

// DefaultForgetAfter is the default of Config.ForgetAfter.
const DefaultForgetAfter = 24 * time.Hour

// Discovery runs the membership and its candidate sources.
type Discovery struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	cands   *candidates
	push    *joinPush
	revive  *revivals // nil: off (benchmarks compare without)
	// notices to members this one suspects, and this member's own
	// refutation when told (notice.go); nil: off (benchmarks compare).
	notices chan string
	refute  chan struct{}
	// lastRefute is when this member last refuted (unix ns).
	lastRefute atomic.Int64
	selfID     string

	// pubMu orders the issue of records: serial stored, record signed.
	pubMu  sync.Mutex
	serial uint64 // last serial issued (and stored)

	mu        sync.Mutex
	record    Record
	meta      []byte
	table     map[string]*Member
	known     map[string]*knownRecord // by cluster ID
	subs      map[*subscriber]struct{}
	dropLog   map[string]time.Time
	selfAddrs map[string]bool

	ml      *memberlist.Memberlist
	keyring *memberlist.Keyring
	// nat is the transport's reach to and from members behind NAT; nil
	// with a transport of Tune's.
	nat  *natTraversal
	mdns *mdnsAdvert

	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	// subsWG counts the subscribers' goroutines; Close waits for them.
	subsWG sync.WaitGroup
	closed bool
}

// knownRecord is the last record accepted from a member. Its serial is the
// highest seen: older records are replays, and an equal serial must come
// with the same bytes. It is kept until the member has been gone for
// ForgetAfter.
type knownRecord struct {
	meta   []byte
	record Record
	gone   time.Time // zero while the member is alive
}

// New checks cfg and prepares a Discovery; Start brings it up.
func New(cfg Config) (*Discovery, error) {
	if cfg.Identity.Private == nil {
		return nil, errors.New("discovery: no cluster identity")
	}
	if len(cfg.Keys) == 0 {
		return nil, errors.New("discovery: no federation key")
	}
	if cfg.Protocol == 0 {
		return nil, errors.New("discovery: no peering protocol version to advertise (pass peering.ProtocolVersion)")
	}
	for i, k := range cfg.Keys {
		if err := validateKey(k); err != nil {
			return nil, fmt.Errorf("discovery: key %d: %w", i, err)
		}
	}
	if !cfg.BindAddr.IsValid() {
		cfg.BindAddr = netip.AddrPortFrom(netip.IPv4Unspecified(), DefaultGossipPort)
	}
	if cfg.BrowseInterval <= 0 {
		cfg.BrowseInterval = 10 * time.Second
	}
	if cfg.ResolveInterval <= 0 {
		cfg.ResolveInterval = 30 * time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(15*time.Second, cfg.RetryMin)
	}
	if cfg.Profile == "" {
		cfg.Profile = ProfileLAN
	}
	for _, s := range cfg.Seeds {
		if err := validateSeed(s); err != nil {
			return nil, fmt.Errorf("discovery: %w", err)
		}
	}
	for _, dom := range cfg.DNSDomains {
		if _, ok := dnsName(dom); !ok {
			return nil, fmt.Errorf("discovery: DNS domain %q is not a domain name", dom)
		}
	}
	if cfg.ForgetAfter <= 0 {
		cfg.ForgetAfter = DefaultForgetAfter
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Discovery{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "discovery"),
		cands:     newCandidates(cfg.RetryMin, cfg.RetryMax),
		push:      newJoinPush(settleTime),
		revive:    newRevivals(),
		selfID:    cfg.Identity.ClusterID(),
		table:     make(map[string]*Member),
		known:     make(map[string]*knownRecord),
		subs:      make(map[*subscriber]struct{}),
		dropLog:   make(map[string]time.Time),
		selfAddrs: make(map[string]bool),
		done:      make(chan struct{}),
	}
	if !cfg.NoSuspicionNotice {
		d.notices, d.refute = make(chan string, noticeQueue), make(chan struct{}, 1)
	}
	if err := d.loadSerial(); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	d.record = Record{Endpoint: cfg.Endpoint, Protocol: cfg.Protocol, OutboundOnly: cfg.OutboundOnly}
	if _, err := d.issue(func(*Record) {}); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	m, err := newMetrics(d, cfg.Metrics)
	if err != nil {
		return nil, err
	}
	d.metrics = m
	return d, nil
}

func (d *Discovery) memberlistConfig() (*memberlist.Config, error) {
	var mc *memberlist.Config
	switch d.cfg.Profile {
	case ProfileLAN:
		mc = lanConfig()
	case ProfileWAN:
		mc = memberlist.DefaultWANConfig()
	case ProfileLocal:
		mc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("discovery: unknown profile %q (lan, wan, local)", d.cfg.Profile)
	}
	kr, err := memberlist.NewKeyring(d.cfg.Keys, d.cfg.Keys[0])
	if err != nil {
		return nil, fmt.Errorf("discovery: federation keyring: %w", err)
	}
	d.keyring = kr
	mc.Name = d.selfID
	// A member declared dead may come back at once at another address:
	// a cluster's gateway moves to another node when its node dies
	// (docs/ha.md), under the same name (the cluster ID). Without this,
	// memberlist refuses the new address as a conflict until it forgets
	// the dead member (GossipToTheDeadTime, 30 s). A live or suspect
	// member's address is still never taken over.
	mc.DeadNodeReclaimTime = time.Nanosecond
	mc.BindAddr = d.cfg.BindAddr.Addr().String()
	mc.BindPort = int(d.cfg.BindAddr.Port())
	if d.cfg.AdvertiseAddr.IsValid() {
		mc.AdvertiseAddr = d.cfg.AdvertiseAddr.Addr().String()
		mc.AdvertisePort = int(d.cfg.AdvertiseAddr.Port())
	} else {
		mc.AdvertisePort = mc.BindPort
	}
	mc.Keyring = kr
	mc.GossipVerifyIncoming = true
	mc.GossipVerifyOutgoing = true
	mc.Delegate = (*delegate)(d)
	mc.Events = (*delegate)(d)
	mc.Alive = (*delegate)(d)
	var suspected func(string)
	var refuted func()
	if d.notices != nil {
		suspected, refuted = d.suspected, d.refuted
	}
	mc.Logger = memberlistLogger(d.log, suspected, refuted)
	if d.cfg.Tune != nil {
		d.cfg.Tune(mc)
	}
	return mc, nil
}

// listen opens the gossip transport on mc's bind address and puts the
// port it got into mc, as memberlist does for its own transport.
func (d *Discovery) listen(mc *memberlist.Config) (*transport, error) {
	ip, err := netip.ParseAddr(mc.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("discovery: gossip bind address %q: %w", mc.BindAddr, err)
	}
	keyring := d.keyring
	g := gates{
		streams: newStreamGate(d.cfg.Streams, func(reason string) { d.metrics.streamsLimited.WithLabelValues(reason).Inc() }, d.log),
		packets: newPacketGate(d.cfg.Packets, d.metrics.packetsLimited.Inc, d.log),
		nat:     newNATTraversal(d.cfg.OutboundOnly, keyring.GetKeys, time.Now),
	}
	t, err := newTransport(netip.AddrPortFrom(ip, uint16(mc.BindPort)), d.log, g)
	if err != nil {
		return nil, fmt.Errorf("discovery: start gossip: %w", err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = t.Port()
	}
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = t.Port()
	}
	advIP, advPort, err := t.FinalAdvertiseAddr(mc.AdvertiseAddr, mc.AdvertisePort)
	if err != nil {
		_ = t.Shutdown()
		return nil, fmt.Errorf("discovery: %w", err)
	}
	adv, _ := netip.AddrFromSlice(advIP)
	g.nat.setAdvertise(netip.AddrPortFrom(adv.Unmap(), uint16(advPort)))
	d.nat = g.nat
	return t, nil
}

// Start joins the gossip and starts the candidate sources. Candidates are
// joined in the background; Start does not wait for any member.
func (d *Discovery) Start(ctx context.Context) error {
	mc, err := d.memberlistConfig()
	if err != nil {
		return err
	}
	if mc.Transport == nil { // Tune may have set one (benchmarks)
		t, err := d.listen(mc)
		if err != nil {
			return err
		}
		mc.Transport = t
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = mc.Transport.Shutdown()
		return fmt.Errorf("discovery: start gossip on %s: %w", d.cfg.BindAddr, err)
	}
	d.ml = ml
	self := ml.LocalNode()
	d.mu.Lock()
	d.selfAddrs[self.Address()] = true
	d.selfAddrs[net.JoinHostPort(d.cfg.BindAddr.Addr().String(), strconv.Itoa(int(self.Port)))] = true
	d.mu.Unlock()
	d.log.Info("gossip started", "cluster", d.selfID, "addr", self.Address(),
		"keys", fingerprints(d.keyring.GetKeys()))

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	for _, s := range d.cfg.Seeds {
		if d.cands.add(s, SourceSeed, 0) {
			d.metrics.found.WithLabelValues(string(SourceSeed)).Inc()
		}
	}
	if d.cfg.MDNS {
		adv, err := d.startMDNS()
		if err != nil {
			cancel()
			_ = ml.Shutdown()
			return err
		}
		d.mdns = adv
		d.goRun(func() { d.browseLoop(runCtx) })
	}
	if len(d.cfg.DNSDomains) > 0 {
		r, err := newDNSResolver(d.cfg.DNSServer)
		if err != nil {
			cancel()
			d.stopMDNS()
			_ = ml.Shutdown()
			return err
		}
		d.goRun(func() { d.dnsLoop(runCtx, r) })
	}
	d.goRun(func() { d.joinLoop(runCtx) })
	d.goRun(func() { d.pushLoop(runCtx) })
	if d.revive != nil {
		d.goRun(func() { d.reviveLoop(runCtx) })
	}
	if d.notices != nil {
		d.goRun(func() { d.noticeLoop(runCtx) })
		// The shortest suspicion timeout memberlist uses (the
		// multiplier × log10(members) intervals, log10 at least 1).
		quiet := time.Duration(mc.SuspicionMult) * mc.ProbeInterval
		d.goRun(func() { d.refuteLoop(runCtx, quiet) })
	}
	return nil
}

func (d *Discovery) goRun(f func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
}

// Close leaves the federation (members see a Leave, not a failure), stops
// every source and closes all event streams.
func (d *Discovery) Close() error {
	d.mu.Lock()
	if d.closed || d.ml == nil {
		d.closed = true
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	d.stopMDNS()
	var errs []error
	if err := d.republish(func(r *Record) { r.Leaving = true }); err != nil {
		d.log.Debug("announce leave", "err", err)
	}
	if err := d.ml.Leave(2 * time.Second); err != nil {
		errs = append(errs, fmt.Errorf("leave gossip: %w", err))
	}
	if err := d.ml.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("stop gossip: %w", err))
	}
	close(d.done)
	d.subsWG.Wait()
	return errors.Join(errs...)
}

// Kill stops gossip without leaving, as a crash would (tests, benchmarks).
func (d *Discovery) kill() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	d.stopMDNS()
	_ = d.ml.Shutdown()
	close(d.done)
	d.subsWG.Wait()
}

// issue makes this cluster's record, changed, under a new serial that is
// stored before the record is signed: no record ever carries a serial that
// a restart could issue again.
func (d *Discovery) issue(change func(*Record)) (Record, error) {
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	d.mu.Lock()
	r := d.record
	d.mu.Unlock()
	change(&r)
	serial, err := d.nextSerial()
	if err != nil {
		return Record{}, err
	}
	r.Serial = serial
	meta, err := SignRecord(d.cfg.Identity, r)
	if err != nil {
		return Record{}, fmt.Errorf("sign member record: %w", err)
	}
	r, _ = DecodeRecord(meta)
	d.mu.Lock()
	d.record, d.meta = r, meta
	d.mu.Unlock()
	return r, nil
}

// SetEndpoint publishes a new peering endpoint in this cluster's record.
func (d *Discovery) SetEndpoint(ep string) error {
	if err := validateEndpoint(ep); err != nil {
		return fmt.Errorf("set peering endpoint: %w", err)
	}
	return d.republish(func(r *Record) { r.Endpoint = ep })
}

// republish signs a changed record with a higher serial and gossips it.
func (d *Discovery) republish(change func(*Record)) error {
	r, err := d.issue(change)
	if err != nil {
		return err
	}
	if d.ml == nil {
		return nil
	}
	// UpdateNode fails only when no member acknowledged the broadcast in
	// time; the record still spreads by gossip and push/pull.
	if err := d.ml.UpdateNode(time.Second); err != nil {
		d.log.Debug("member record not yet acknowledged", "serial", r.Serial, "err", err)
	}
	return nil
}

// Subscribe returns the member events from now on, starting with a Join
// for every member alive at the time of the call. The channel is closed
// when ctx ends or the Discovery is closed. A subscriber that reads slowly
// sees only the latest event of each member.
func (d *Discovery) Subscribe(ctx context.Context) <-chan Event {
	s := newSubscriber(d.metrics.coalesced.Inc)
	d.mu.Lock()
	ids := make([]string, 0, len(d.table))
	for id := range d.table {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if m := d.table[id]; m.State == StateAlive {
			s.publish(Event{Kind: Join, Member: *m})
		}
	}
	d.subs[s] = struct{}{}
	d.subsWG.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.subsWG.Done()
		s.run(ctx, d.done)
		d.mu.Lock()
		delete(d.subs, s)
		d.mu.Unlock()
	}()
	return s.out
}

// Snapshot is the state of discovery for status pages.
type Snapshot struct {
	Self Record
	// Gossip is this agent's gossip address.
	Gossip string
	// Members are the other clusters, sorted by cluster ID.
	Members    []Member
	Candidates []Candidate
	// KeyFingerprints name the installed federation keys, primary first.
	KeyFingerprints []string
}

// Snapshot returns the current state.
func (d *Discovery) Snapshot() Snapshot {
	s := Snapshot{Members: d.members(), Candidates: d.cands.list()}
	d.mu.Lock()
	s.Self = d.record
	d.mu.Unlock()
	if d.ml != nil {
		s.Gossip = d.ml.LocalNode().Address()
		s.KeyFingerprints = fingerprints(d.Keys())
	}
	return s
}

// Alive returns the cluster IDs of the alive members, sorted.
func (d *Discovery) Alive() []string {
	var ids []string
	for _, m := range d.members() {
		if m.State == StateAlive {
			ids = append(ids, m.ClusterID)
		}
	}
	return ids
}

func (d *Discovery) members() []Member {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Member, 0, len(d.table))
	for _, m := range d.table {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ClusterID < out[j].ClusterID })
	return out
}

// prune forgets members that have been gone for longer than age, and
// their highest serials once they have been gone for ForgetAfter.
func (d *Discovery) prune(age time.Duration) {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, m := range d.table {
		if m.State != StateAlive && now.Sub(m.Since) > age {
			delete(d.table, id)
		}
	}
	for id, k := range d.known {
		if !k.gone.IsZero() && now.Sub(k.gone) > d.cfg.ForgetAfter {
			delete(d.known, id)
		}
	}
}

// memberAddrs returns the gossip addresses of this agent and every alive
// member.
func (d *Discovery) memberAddrs() map[string]bool {
	known := make(map[string]bool)
	d.mu.Lock()
	for a := range d.selfAddrs {
		known[a] = true
	}
	for _, m := range d.table {
		if m.State == StateAlive {
			known[m.Gossip.String()] = true
		}
	}
	d.mu.Unlock()
	return known
}

// Keys returns the installed federation keys, primary first.
func (d *Discovery) Keys() [][]byte {
	keys := d.keyring.GetKeys() // primary first
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = slices.Clone(k)
	}
	return out
}

// InstallKey adds a federation key that decrypts but does not yet encrypt.
// Rotation: install the new key on every member, then UseKey on every
// member, then RemoveKey of the old one; no member is dropped.
func (d *Discovery) InstallKey(k []byte) error {
	if err := validateKey(k); err != nil {
		return err
	}
	if err := d.keyring.AddKey(k); err != nil {
		return fmt.Errorf("install federation key %s: %w", keyID(k), err)
	}
	d.readvertise()
	return nil
}

// UseKey makes an installed key the primary (encrypting) key.
func (d *Discovery) UseKey(k []byte) error {
	if err := d.keyring.UseKey(k); err != nil {
		return fmt.Errorf("use federation key %s: %w", keyID(k), err)
	}
	d.readvertise()
	return nil
}

// RemoveKey retires a key; the primary key cannot be removed.
func (d *Discovery) RemoveKey(k []byte) error {
	if bytes.Equal(k, d.keyring.GetPrimaryKey()) {
		return fmt.Errorf("remove federation key %s: it is the primary key; use another first", keyID(k))
	}
	if err := d.keyring.RemoveKey(k); err != nil {
		return fmt.Errorf("remove federation key %s: %w", keyID(k), err)
	}
	d.readvertise()
	return nil
}

// drop counts a refused record and logs it at most once a minute per
// member and reason, so a flood cannot flood the log.
func (d *Discovery) drop(name, reason string, err error) {
	d.metrics.recordsDrop.WithLabelValues(reason).Inc()
	key := name + "\x00" + reason
	now := time.Now()
	d.mu.Lock()
	last, seen := d.dropLog[key]
	if !seen || now.Sub(last) > time.Minute {
		if len(d.dropLog) > 4096 {
			clear(d.dropLog)
		}
		d.dropLog[key] = now
	}
	d.mu.Unlock()
	if !seen || now.Sub(last) > time.Minute {
		d.log.Warn("member record refused", "member", truncate(name, 64), "reason", reason, "err", err)
	}
}

// verify checks a member's metadata; the last accepted record is kept per
// member so the signature is checked once per record, not once per gossip
// message.
func (d *Discovery) verify(name string, meta []byte) (Record, error) {
	d.mu.Lock()
	if k, ok := d.known[name]; ok && bytes.Equal(k.meta, meta) {
		d.mu.Unlock()
		return k.record, nil
	}
	d.mu.Unlock()
	r, err := DecodeRecord(meta)
	if err != nil {
		return Record{}, err
	}
	if r.ClusterID != name {
		return Record{}, &RecordError{Reason: ReasonNameMismatch,
			Err: fmt.Errorf("member %q carries the record of %s", truncate(name, 64), r.ClusterID)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.known[name]
	switch {
	case !ok:
		// Not alive until memberlist reports the join; forgotten in time
		// if it never does.
		k = &knownRecord{gone: d.cfg.Now()}
		d.known[name] = k
	case bytes.Equal(k.meta, meta):
		return k.record, nil
	case r.Serial < k.record.Serial:
		return Record{}, &RecordError{Reason: ReasonStale,
			Err: fmt.Errorf("record of %s has serial %d, already saw %d", name, r.Serial, k.record.Serial)}
	case r.Serial == k.record.Serial:
		return Record{}, &RecordError{Reason: ReasonSerialReused,
			Err: fmt.Errorf("record of %s reuses serial %d with other content", name, r.Serial)}
	}
	k.meta, k.record = slices.Clone(meta), r
	return r, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// delegate implements memberlist's delegate interfaces without putting
// them in Discovery's exported method set.
type delegate Discovery

func (g *delegate) d() *Discovery { return (*Discovery)(g) }

// NodeMeta returns this cluster's signed record.
func (g *delegate) NodeMeta(limit int) []byte {
	d := g.d()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return slices.Clone(d.meta)
}

func (g *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState says, in every exchange started by a join (not memberlist's
// periodic ones), why it was started and by whom (joinpush.go).
func (g *delegate) LocalState(join bool) []byte {
	if !join {
		return nil
	}
	d := g.d()
	return encodeExchange(d.push.kind(), d.selfID)
}

// MergeRemoteState notes a member that joined us, or a push from a member
// we joined (joinpush.go); it runs after memberlist merged the member's
// state, its record verified.
func (g *delegate) MergeRemoteState(buf []byte, join bool) {
	d := g.d()
	if !join || len(buf) == 0 {
		return // a periodic exchange, or an agent that sends no word
	}
	kind, id, err := decodeExchange(buf)
	if err != nil {
		d.metrics.messagesDrop.WithLabelValues(MsgDropExchangeState).Inc()
		d.log.Debug("member's exchange state dropped", "err", err)
		return
	}
	if kind == exchangeFollow || id == d.selfID {
		return
	}
	d.mu.Lock()
	m := d.table[id]
	var addr string
	if m != nil && m.State == StateAlive {
		addr = m.Gossip.String()
	}
	d.mu.Unlock()
	switch {
	case addr == "":
	case kind == exchangePush:
		d.cands.pushed(addr)
	default:
		d.push.sawJoin(id, addr, time.Now())
	}
}

// NotifyAlive keeps out members whose record does not verify: memberlist
// ignores an alive message when this returns an error.
func (g *delegate) NotifyAlive(n *memberlist.Node) error {
	d := g.d()
	if n.Name == d.selfID {
		return nil
	}
	r, err := d.verify(n.Name, n.Meta)
	if err != nil {
		d.drop(n.Name, ReasonOf(err), err)
		return err
	}
	if d.nat != nil {
		addr, _ := netip.AddrFromSlice(n.Addr)
		d.nat.setBehind(netip.AddrPortFrom(addr.Unmap(), n.Port), r.OutboundOnly)
	}
	return nil
}

func (g *delegate) NotifyJoin(n *memberlist.Node)   { g.d().memberChanged(n, Join) }
func (g *delegate) NotifyUpdate(n *memberlist.Node) { g.d().memberChanged(n, Update) }
func (g *delegate) NotifyLeave(n *memberlist.Node)  { g.d().memberChanged(n, Failed) }

// memberChanged runs on memberlist's goroutines with its node lock held:
// it only updates the table and queues events.
func (d *Discovery) memberChanged(n *memberlist.Node, kind EventKind) {
	if n.Name == d.selfID {
		return
	}
	r, err := d.verify(n.Name, n.Meta)
	if err != nil {
		// NotifyAlive refused this record already; nothing to report.
		return
	}
	addr, _ := netip.AddrFromSlice(n.Addr)
	gossip := netip.AddrPortFrom(addr.Unmap(), n.Port)
	sources := memberSources(d.cands.sourceIndex(), gossip)
	now := d.cfg.Now()
	d.mu.Lock()
	m, ok := d.table[n.Name]
	if !ok {
		m = &Member{ClusterID: n.Name}
		d.table[n.Name] = m
	}
	m.Gossip = gossip
	m.Sources = sources
	m.Record = r
	state := StateAlive
	if kind == Failed {
		state = StateFailed
		if r.Leaving {
			kind, state = Leave, StateLeft
		}
	}
	if m.State != state {
		m.State, m.Since = state, now
	}
	if k := d.known[n.Name]; k != nil {
		switch {
		case state == StateAlive:
			k.gone = time.Time{}
		case k.gone.IsZero():
			k.gone = now
		}
	}
	ev := Event{Kind: kind, Member: *m}
	for s := range d.subs {
		s.publish(ev)
	}
	d.mu.Unlock()
	d.log.Info("member "+kind.String(), "member", n.Name, "gossip", m.Gossip, "endpoint", r.Endpoint)
	if kind == Failed {
		d.cands.recheckSoon(d.cfg.RetryMin)
		if d.revive != nil && d.revives(n.Name) {
			d.revive.schedule(n.Name, gossip.String(), time.Now())
		}
	}
}
