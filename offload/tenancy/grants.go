package tenancy

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/peering"
)

// GrantPolicy is what a provider does for a peer whose Peer leaves
// spec.offloading empty.
type GrantPolicy string

const (
	// GrantsManual: nothing without the admin's Grant (the default: API
	// access is never automatic).
	GrantsManual GrantPolicy = "manual"
	// GrantsAuto: every peer is granted unless denied.
	GrantsAuto GrantPolicy = "auto"
)

// ParseGrantPolicy reads --offload-grants.
func ParseGrantPolicy(s string) (GrantPolicy, error) {
	switch p := GrantPolicy(s); p {
	case GrantsManual, GrantsAuto:
		return p, nil
	}
	return "", fmt.Errorf("offload grants policy %q: want manual or auto", s)
}

// GrantSender carries sealed grants to peers (*peering.Engine): nil
// withdraws what was set.
type GrantSender interface {
	SetGrant(id string, sealed []byte) error
}

// FenceCheck is nil when the admission policies that confine the agent
// and its consumers are proven in force (*Fences).
type FenceCheck interface {
	Enforced() error
	// Checked is closed once the first check has a verdict: Grants waits
	// for it, so that a Peer does not show a refusal only for want of a
	// first check.
	Checked() <-chan struct{}
}

// Tenancy is what the provider needs of the tenants it keeps (*Tenants).
type Tenancy interface {
	Ensure(ctx context.Context, consumer string, limits grant.Limits) (Tenant, error)
	EnsureIssued(ctx context.Context, consumer string, limits grant.Limits) (Tenant, Token, error)
	Remove(ctx context.Context, consumer string) error
	List(ctx context.Context) ([]string, error)
}

// SerialStore keeps the last grant serial issued (*ipam.Ledger).
type SerialStore interface {
	LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error)
	PutKey(name string, value []byte) error
}

// GrantsConfig is what Grants needs.
type GrantsConfig struct {
	Identity identity.Identity
	// Peers reads Peer objects (the informer's cache); Client writes their
	// status.
	Peers  client.Reader
	Client client.Client
	// Tenants creates, issues for and removes tenants.
	Tenants Tenancy
	// APIServer is the address announced with every grant.
	APIServer func(context.Context) (APIServer, error)
	Sender    GrantSender
	Serials   SerialStore
	Policy    GrantPolicy
	// Fences says whether the admission policies are in force (*Fences):
	// nothing is issued while they are not.
	Fences FenceCheck
	// Grace is how long a member may be gone before its grant is revoked
	// (the agent's --offload-revoke-after, a day by default: far longer
	// than the peering's unreachable grace, so that a partition does not
	// remove what the consumer runs here).
	Grace time.Duration
	// Changed, when set, is told of every consumer whose grant was given,
	// renewed, changed or revoked (namespace mirroring looks again).
	Changed func(consumer string)
	// RenewAt is the part of a token's life after which a new one is
	// issued (default 2/3).
	RenewAt float64

	Logger  *slog.Logger
	Metrics prometheus.Registerer
	Now     func() time.Time
}

// Grants grants peers offloading to this cluster: for each peer granted
// (by its Peer's spec or the policy) it keeps a tenant, issues a token,
// seals it to the peer with this cluster's API server address and hands it
// to the peering engine, renews it before it expires, and revokes it when
// the grant ends. Level-triggered: one reconcile per peer, from the Peer
// object, the member's state and what this side holds.
type Grants struct {
	cfg   GrantsConfig
	log   *slog.Logger
	ctrl  *ctrl.Controller[string]
	queue ctrl.Queue[string]
	m     *providerMetrics

	mu      sync.Mutex
	members map[string]memberState
	issued  map[string]*issuedGrant
	tenants map[string]bool // consumers with a tenant of ours
	// owed: consumers revoked before their key was known (after a
	// restart), told once it is.
	owed map[string]bool
	// held: consumers granted whose credentials are held back while the
	// fences are not proven.
	held   map[string]bool
	serial sync.Mutex // serialises nextSerial
}

type memberState struct {
	key       ed25519.PublicKey
	alive     bool
	goneSince time.Time
	// networks are this cluster's views of the member's networks, as
	// AnnotationEndpointNetworks lists them.
	networks string
}

// issuedGrant is what was last sent to a consumer, without its token.
type issuedGrant struct {
	serial    uint64
	namespace string
	server    string
	limits    grant.Limits
	expires   time.Time
	renewAt   time.Time
}

const serialKey = "grant-serial"

// NewGrants checks cfg and prepares Grants; Run starts it.
func NewGrants(cfg GrantsConfig) (*Grants, error) {
	if cfg.Identity.Private == nil || cfg.Peers == nil || cfg.Client == nil || cfg.Tenants == nil ||
		cfg.APIServer == nil || cfg.Sender == nil || cfg.Serials == nil || cfg.Fences == nil {
		return nil, errors.New("offload provider: identity, Peers, client, tenants, API server, sender, serials and fences are required")
	}
	if _, err := ParseGrantPolicy(string(cfg.Policy)); err != nil {
		return nil, err
	}
	if cfg.RenewAt == 0 {
		cfg.RenewAt = 2.0 / 3
	}
	if cfg.RenewAt <= 0 || cfg.RenewAt >= 1 {
		return nil, fmt.Errorf("offload provider: renew at %v of a token's life, want between 0 and 1", cfg.RenewAt)
	}
	if cfg.Grace == 0 {
		cfg.Grace = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Grants{
		cfg: cfg, log: cfg.Logger.With("component", "grants"),
		members: map[string]memberState{}, issued: map[string]*issuedGrant{}, tenants: map[string]bool{}, owed: map[string]bool{}, held: map[string]bool{},
	}
	var err error
	if p.m, err = newProviderMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("offload provider: metrics: %w", err)
	}
	p.ctrl, err = ctrl.New(ctrl.Config[string]{
		Name: "grants", Workers: providerWorkers, Reconcile: p.reconcile, Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[string]{Logger: p.log, Failed: "grant not reconciled; retrying", Attrs: ctrl.Named[string]("peer")},
		Failed: func(string, error) { p.m.errors.Inc() },
	})
	if err != nil {
		return nil, fmt.Errorf("offload provider: %w", err)
	}
	p.queue = p.ctrl.Queue()
	return p, nil
}

// PeerChanged takes the engine's state of a peer (the member's key and
// whether it is alive). It never blocks.
func (p *Grants) PeerChanged(s peering.PeerState) {
	p.mu.Lock()
	old, known := p.members[s.ClusterID]
	st := memberState{key: s.IdentityKey, alive: s.Member.OK, goneSince: old.goneSince, networks: viewsOf(s)}
	if len(st.key) == 0 {
		st.key = old.key
	}
	if len(s.TheirNetworks) == 0 {
		st.networks = old.networks // not agreed yet, or gone: keep what was agreed
	}
	switch {
	case st.alive:
		st.goneSince = time.Time{}
	case !known || old.alive:
		st.goneSince = p.cfg.Now()
	}
	p.members[s.ClusterID] = st
	p.mu.Unlock()
	if !known || old.alive != st.alive || !old.key.Equal(st.key) || old.networks != st.networks {
		p.queue.Add(s.ClusterID)
	}
}

// viewsOf lists this cluster's views of the peer's networks: where its
// endpoints are, as this cluster reaches them.
func viewsOf(s peering.PeerState) string {
	nets := make([]netip.Prefix, 0, len(s.TheirNetworks))
	for _, v := range s.TheirNetworks {
		if v.As.IsValid() {
			nets = append(nets, v.As)
		}
	}
	return endpointNetworks(nets)
}

// Granted returns the limits this provider grants consumer now, and false
// when it does not grant it (never granted, revoked, or not yet granted
// since a restart: a credential is sent first).
func (p *Grants) Granted(consumer string) (grant.Limits, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.issued[consumer]; g != nil {
		return g.limits, true
	}
	return grant.Limits{}, false
}

// PeerHandler enqueues the Peers whose spec changed, or that were deleted.
func (p *Grants) PeerHandler() toolscache.ResourceEventHandler {
	return peerEvents(p.queue)
}

func peerEvents(q workqueue.TypedInterface[string]) toolscache.ResourceEventHandler {
	name := func(obj any) string {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(metav1.Object); ok {
			return o.GetName()
		}
		return ""
	}
	add := func(obj any) {
		if n := name(obj); identity.ValidateClusterID(n) == nil {
			q.Add(n)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: add,
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(metav1.Object)
			n, ok2 := obj.(metav1.Object)
			if !ok1 || !ok2 || o.GetGeneration() != n.GetGeneration() {
				add(obj)
			}
		},
		DeleteFunc: add,
	}
}

// providerWorkers reconcile different consumers at once; the queue never
// hands one consumer to two workers.
const providerWorkers = 2

// Run reconciles until ctx ends: first every consumer that has a tenant
// (so tenants no longer granted go after a restart), then as events come.
func (p *Grants) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	select {
	case <-p.cfg.Fences.Checked():
	case <-ctx.Done():
		return nil
	}
	consumers, err := p.cfg.Tenants.List(ctx)
	if err != nil {
		return fmt.Errorf("offload provider: list tenants: %w", err)
	}
	p.mu.Lock()
	for _, c := range consumers {
		p.tenants[c] = true
		p.queue.Add(c)
	}
	p.mu.Unlock()
	return p.ctrl.Run(ctx, nil)
}

// hold forgets the credential issued to consumer, so that none is renewed
// and mirroring gives it nothing new; the tenant stays, and the last
// token expires on its own.
func (p *Grants) hold(id string) {
	p.mu.Lock()
	p.held[id] = true
	_, had := p.issued[id]
	delete(p.issued, id)
	p.mu.Unlock()
	if had {
		p.log.Warn("credential held back: the admission policies are not in force", "peer", id)
		p.changed(id)
	}
}

// FencesChanged looks at every peer again (Fences.Changed).
func (p *Grants) FencesChanged() {
	p.mu.Lock()
	ids := map[string]bool{}
	for _, m := range []map[string]bool{p.tenants, p.held} {
		for id := range m {
			ids[id] = true
		}
	}
	for id := range p.members {
		ids[id] = true
	}
	p.mu.Unlock()
	for id := range ids {
		p.queue.Add(id)
	}
}

// Ready fails while peers granted are held back for want of the fences
// (the agent's /readyz): a provider asked to grant that cannot is not
// ready; one that grants nothing does not care.
func (p *Grants) Ready() error {
	p.mu.Lock()
	n := len(p.held)
	p.mu.Unlock()
	err := p.cfg.Fences.Enforced()
	if n == 0 || err == nil {
		return nil
	}
	return fmt.Errorf("%d granted peers get nothing: %w", n, err)
}

// verdict is what a peer should have, and why.
type verdict struct {
	grant   bool
	reason  string
	message string
}

func (p *Grants) verdictFor(peer *v1alpha1.Peer, m memberState, known bool, now time.Time) verdict {
	switch {
	case peer == nil:
		return verdict{reason: "PeerDeleted", message: "the Peer object was deleted"}
	case peer.Spec.Offloading == v1alpha1.OffloadingDeny:
		return verdict{reason: "Denied", message: "spec.offloading is Deny"}
	case peer.Spec.Offloading == v1alpha1.OffloadingDefault && p.cfg.Policy != GrantsAuto:
		return verdict{reason: "NotGranted", message: "under --offload-grants=manual a peer may offload here only once granted: set spec.offloading to Grant (flotilla grant " + peer.Name + ")"}
	case !known || len(m.key) == 0:
		return verdict{grant: true, reason: "WaitingForPeer", message: "granted; waiting for the peer's identity from the membership"}
	case !m.alive && now.Sub(m.goneSince) >= p.cfg.Grace:
		return verdict{reason: "PeerGone", message: fmt.Sprintf("the peer has been gone since %s, longer than the grace period (%s)", m.goneSince.UTC().Format(time.RFC3339), p.cfg.Grace)}
	}
	return verdict{grant: true, reason: "Granted"}
}

// reconcile brings one consumer's tenant, credential and status in line;
// it returns when to look again.
func (p *Grants) reconcile(ctx context.Context, id string) (time.Duration, error) {
	now := p.cfg.Now()
	var peer *v1alpha1.Peer
	var obj v1alpha1.Peer
	if err := p.cfg.Peers.Get(ctx, client.ObjectKey{Name: id}, &obj); err == nil {
		peer = &obj
	} else if !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("read Peer %s: %w", id, err)
	}
	p.mu.Lock()
	m, known := p.members[id]
	p.mu.Unlock()
	v := p.verdictFor(peer, m, known, now)
	if !v.grant {
		p.mu.Lock()
		delete(p.held, id)
		p.mu.Unlock()
		if err := p.revoke(ctx, id, m.key, v.reason); err != nil {
			return 0, err
		}
		return 0, p.writeStatus(ctx, peer, offload.GrantCondition{Reason: v.reason, Message: v.message})
	}
	if err := p.cfg.Fences.Enforced(); err != nil {
		p.hold(id)
		return 0, p.writeStatus(ctx, peer, offload.GrantCondition{Reason: v1alpha1.ReasonFencesNotEnforced,
			Message: "this cluster grants nothing while its admission policies are not in force: " + err.Error()})
	}
	p.mu.Lock()
	delete(p.held, id)
	p.mu.Unlock()
	if v.reason == "WaitingForPeer" {
		return 0, p.writeStatus(ctx, peer, offload.GrantCondition{Reason: v.reason, Message: v.message})
	}
	limits := offload.LimitsOf(peer.Spec.OffloadLimits)
	limits.Fence.EndpointNetworks = m.networks
	g, err := p.ensureGranted(ctx, id, m.key, limits, now)
	if err != nil {
		if werr := p.writeStatus(ctx, peer, offload.GrantCondition{Reason: failureReason(err), Message: err.Error()}); werr != nil {
			p.log.Warn("cannot write a Peer's grant status", "peer", id, "err", werr)
		}
		return 0, err
	}
	st := offload.GrantCondition{
		OK: true, Reason: "Granted",
		Message: fmt.Sprintf("tenant namespace %s on %s; the peer's credential expires at %s and is renewed before",
			g.namespace, g.server, g.expires.UTC().Format(time.RFC3339)),
		Grant: &v1alpha1.GrantStatus{Namespace: g.namespace, Server: g.server, Limits: offload.LimitsStatus(g.limits), Expires: &metav1.Time{Time: g.expires.Truncate(time.Second)}},
	}
	if !m.alive {
		// Checked again when the grace period ends.
		return max(m.goneSince.Add(p.cfg.Grace).Sub(now), time.Second), p.writeStatus(ctx, peer, st)
	}
	return max(g.renewAt.Sub(now), time.Second), p.writeStatus(ctx, peer, st)
}

// errNoAPIServer marks a failure to find the address to announce.
var errNoAPIServer = errors.New("no API server address to announce")

func failureReason(err error) string {
	if errors.Is(err, errNoAPIServer) {
		return "NoAPIServer"
	}
	return "Failed"
}

// ensureGranted keeps the consumer's tenant and, when none is current,
// issues, seals and sends a new credential.
func (p *Grants) ensureGranted(ctx context.Context, id string, key ed25519.PublicKey, limits grant.Limits, now time.Time) (issuedGrant, error) {
	api, err := p.cfg.APIServer(ctx)
	if err != nil {
		return issuedGrant{}, fmt.Errorf("%w: %w", errNoAPIServer, err)
	}
	p.mu.Lock()
	cur := p.issued[id]
	p.mu.Unlock()
	current := func(namespace string) bool {
		return cur != nil && now.Before(cur.renewAt) && sealedLimits(cur.limits) == sealedLimits(limits) && cur.server == api.URL && cur.namespace == namespace
	}
	if current(offload.TenantNamespace(id)) {
		if _, err := p.cfg.Tenants.Ensure(ctx, id, limits); err != nil {
			return issuedGrant{}, fmt.Errorf("tenant of %s: %w", id, err)
		}
		p.mu.Lock()
		p.tenants[id] = true
		p.mu.Unlock()
		if cur.limits == limits {
			return *cur, nil
		}
		// Only the provider's side changed: nothing to send, but the
		// mirrored namespaces get it.
		p.mu.Lock()
		ig := *cur
		ig.limits = limits
		p.issued[id] = &ig
		p.mu.Unlock()
		p.changed(id)
		return ig, nil
	}
	// A new credential's serial is kept in the ledger (a synced write)
	// while the tenant is made and the token issued; a serial left unused
	// by a failure is only a gap.
	var serial uint64
	var serialErr error
	var wg sync.WaitGroup
	wg.Go(func() { serial, serialErr = p.nextSerial(now) })
	t, tok, err := p.cfg.Tenants.EnsureIssued(ctx, id, limits)
	wg.Wait()
	if t.Namespace != "" {
		p.mu.Lock()
		p.tenants[id] = true
		p.mu.Unlock()
	}
	if err != nil {
		return issuedGrant{}, fmt.Errorf("tenant and credential of %s: %w", id, err)
	}
	if serialErr != nil {
		return issuedGrant{}, serialErr
	}
	g := grant.Grant{
		Version: grant.Version, Provider: p.cfg.Identity.ClusterID(), Consumer: id, Serial: serial,
		IssuedAt: now, ExpiresAt: tok.Expires, Server: api.URL, CAData: api.CAData,
		Token: tok.Value, Namespace: t.Namespace, Limits: sealedLimits(limits),
	}
	sealed, err := grant.Seal(p.cfg.Identity, key, g)
	if err != nil {
		return issuedGrant{}, fmt.Errorf("seal the grant for %s: %w", id, err)
	}
	if err := p.cfg.Sender.SetGrant(id, sealed); err != nil {
		return issuedGrant{}, fmt.Errorf("send the grant to %s: %w", id, err)
	}
	life := tok.Expires.Sub(now)
	ig := issuedGrant{
		serial: serial, namespace: t.Namespace, server: api.URL, limits: limits,
		expires: tok.Expires, renewAt: now.Add(time.Duration(float64(life) * p.cfg.RenewAt)),
	}
	p.mu.Lock()
	p.issued[id] = &ig
	delete(p.owed, id)
	p.mu.Unlock()
	p.m.issued.Inc()
	p.changed(id)
	p.log.Info("credential granted", "peer", id, "namespace", t.Namespace, "server", api.URL,
		"serial", serial, "expires", tok.Expires.UTC().Format(time.RFC3339))
	return ig, nil
}

// sealedLimits are the limits the consumer is told: without the
// provider's fence.
func sealedLimits(l grant.Limits) grant.Limits {
	l.Fence = grant.Fence{}
	return l
}

// revoke removes the consumer's tenant (its tokens stop working at once)
// and tells the consumer, when it was granted before: by this run, or by
// an earlier one that left the tenant.
func (p *Grants) revoke(ctx context.Context, id string, key ed25519.PublicKey, reason string) error {
	p.mu.Lock()
	hadTenant, cur, owed := p.tenants[id], p.issued[id], p.owed[id]
	p.mu.Unlock()
	if hadTenant {
		if err := p.cfg.Tenants.Remove(ctx, id); err != nil {
			return fmt.Errorf("revoke %s: %w", id, err)
		}
		p.mu.Lock()
		delete(p.tenants, id)
		p.mu.Unlock()
		p.m.revoked.Inc()
		p.changed(id)
		p.log.Info("grant revoked: tenant removed", "peer", id, "reason", reason)
	}
	// After a restart nothing was sent yet, but the consumer may hold a
	// grant from before: it hears of the revocation all the same.
	if cur == nil && !hadTenant && !owed {
		return nil
	}
	if len(key) != 0 {
		serial, err := p.nextSerial(p.cfg.Now())
		if err != nil {
			return err
		}
		g := grant.Grant{Version: grant.Version, Provider: p.cfg.Identity.ClusterID(), Consumer: id, Serial: serial, Revoked: true}
		sealed, err := grant.Seal(p.cfg.Identity, key, g)
		if err != nil {
			return fmt.Errorf("seal the revocation for %s: %w", id, err)
		}
		if err := p.cfg.Sender.SetGrant(id, sealed); err != nil {
			return fmt.Errorf("send the revocation to %s: %w", id, err)
		}
	} else if err := p.cfg.Sender.SetGrant(id, nil); err != nil {
		return fmt.Errorf("withdraw the grant of %s: %w", id, err)
	}
	p.mu.Lock()
	delete(p.issued, id)
	// Without the key no revocation could be sealed: the next reconcile
	// after the membership reports the member sends it.
	if len(key) == 0 {
		p.owed[id] = true
	} else {
		delete(p.owed, id)
	}
	p.mu.Unlock()
	return nil
}

func (p *Grants) changed(consumer string) {
	if p.cfg.Changed != nil {
		p.cfg.Changed(consumer)
	}
}

// nextSerial issues a serial above every one issued before, kept in the
// ledger before it is used, and near the clock (readable in logs).
func (p *Grants) nextSerial(now time.Time) (uint64, error) {
	p.serial.Lock()
	defer p.serial.Unlock()
	b, err := p.cfg.Serials.LoadOrCreateKey(serialKey, func() ([]byte, error) { return make([]byte, 8), nil })
	if err != nil || len(b) != 8 {
		return 0, fmt.Errorf("read the last grant serial: %v (%d bytes)", err, len(b))
	}
	s := max(binary.BigEndian.Uint64(b)+1, uint64(now.UnixNano()))
	if err := p.cfg.Serials.PutKey(serialKey, binary.BigEndian.AppendUint64(nil, s)); err != nil {
		return 0, fmt.Errorf("store the grant serial: %w", err)
	}
	return s, nil
}

// writeStatus applies c when it differs from what the Peer shows.
func (p *Grants) writeStatus(ctx context.Context, peer *v1alpha1.Peer, c offload.GrantCondition) error {
	if peer == nil {
		return nil
	}
	c.Kind, c.Generation = v1alpha1.ConditionOffloadGranted, peer.Generation
	if offload.Shows(peer, c) {
		return nil
	}
	return offload.ApplyGrantStatus(ctx, p.cfg.Client, offload.ProviderFieldOwner, peer.Name, peer, c, p.cfg.Now())
}

type providerMetrics struct {
	issued, revoked, errors prometheus.Counter
}

func newProviderMetrics(reg prometheus.Registerer) (*providerMetrics, error) {
	m := &providerMetrics{
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_credentials_sent_total", Help: "Credentials sealed and handed to the peering engine for a consumer."}),
		revoked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_revocations_total", Help: "Grants revoked (tenant removed)."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_reconcile_errors_total", Help: "Grant reconciles that failed and were retried."}),
	}
	return m, ctrl.Register(reg, m.issued, m.revoked, m.errors)
}
