package remote

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// UsePolicy is what a consumer does with the grant of a provider whose
// Peer leaves spec.offloadTo empty.
type UsePolicy string

const (
	// UseManual: a grant is held but not used until the admin sets
	// spec.offloadTo: Accept on the provider's Peer (the default: a
	// cluster offloads nowhere its admin did not choose).
	UseManual UsePolicy = "manual"
	// UseAuto: every grant is used unless its Peer says Deny.
	UseAuto UsePolicy = "auto"
)

// The reasons of the OffloadCredential condition of a provider whose
// grant is held but not used.
const (
	// ReasonAwaitingOptIn: the Peer's spec.offloadTo is empty under the
	// manual policy.
	ReasonAwaitingOptIn = "AwaitingOptIn"
	// ReasonDeclined: the Peer's spec.offloadTo is Deny.
	ReasonDeclined = "Declined"
)

// ParseUsePolicy reads --offload-to.
func ParseUsePolicy(s string) (UsePolicy, error) {
	switch p := UsePolicy(s); p {
	case UseManual, UseAuto:
		return p, nil
	}
	return "", fmt.Errorf("offload-to policy %q: want manual or auto", s)
}

// accepts says whether peer's admin (or, where its spec is silent or
// there is no Peer yet, the policy) lets this cluster offload to it, and
// if not, why.
func (p UsePolicy) accepts(peer *v1alpha1.Peer) (bool, string) {
	switch {
	case peer == nil && p == UseAuto:
		return true, ""
	case peer == nil:
		return false, ReasonAwaitingOptIn
	case peer.Spec.OffloadTo == v1alpha1.OffloadToDeny:
		return false, ReasonDeclined
	case peer.Spec.OffloadTo == v1alpha1.OffloadToAccept, p == UseAuto:
		return true, ""
	}
	return false, ReasonAwaitingOptIn
}

// ConsumerConfig is what a Consumer needs.
type ConsumerConfig struct {
	// Policy is what happens to the grant of a provider whose Peer's
	// spec.offloadTo is empty (default UseManual: held, not used).
	Policy UsePolicy
	// Store keeps the grants received, sealed, across restarts.
	Store *grant.Store
	// Peers reads Peer objects (the informer's cache); Client writes their
	// status.
	Peers  client.Reader
	Client client.Client
	// Verify checks that a credential works against its provider (default:
	// a SelfSubjectReview made with it).
	Verify func(ctx context.Context, g grant.Grant) error

	Logger  *slog.Logger
	Metrics prometheus.Registerer
	Now     func() time.Time
}

// Consumer holds the credentials providers granted this cluster: it takes
// sealed grants from the peering engine, keeps them (Store), checks that
// each works, says so on the provider's Peer, and hands them to whatever
// offloads (Credential). A credential is never logged, exported or
// written into a status.
type Consumer struct {
	cfg   ConsumerConfig
	log   *slog.Logger
	ctrl  *ctrl.Controller[string]
	queue ctrl.Queue[string]
	m     *consumerMetrics

	mu       sync.Mutex
	incoming map[string]sealedGrant
	held     map[string]grant.Grant
	// refused is the last refusal per provider, shown until a grant is
	// accepted.
	refused map[string]error
	// revoked: the provider revoked what it granted; shown until it grants
	// again.
	revoked map[string]bool
	// accepted: the providers whose grant this cluster's admin accepted,
	// as their Peers last said; only theirs are handed out (Credential).
	accepted map[string]bool
}

type sealedGrant struct {
	key    ed25519.PublicKey
	sealed []byte
}

// NewConsumer prepares a Consumer; Run starts it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if cfg.Store == nil || cfg.Peers == nil || cfg.Client == nil {
		return nil, errors.New("offload consumer: store, Peers and client are required")
	}
	if cfg.Verify == nil {
		cfg.Verify = verifyCredential
	}
	if cfg.Policy == "" {
		cfg.Policy = UseManual
	}
	if _, err := ParseUsePolicy(string(cfg.Policy)); err != nil {
		return nil, fmt.Errorf("offload consumer: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Consumer{
		cfg: cfg, log: cfg.Logger.With("component", "credentials"),
		incoming: map[string]sealedGrant{}, held: map[string]grant.Grant{},
		refused: map[string]error{}, revoked: map[string]bool{}, accepted: map[string]bool{},
	}
	var err error
	if c.m, err = newConsumerMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("offload consumer: metrics: %w", err)
	}
	c.ctrl, err = ctrl.New(ctrl.Config[string]{
		Name: "credentials", BaseDelay: 200 * time.Millisecond, Reconcile: c.reconcile, Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[string]{Logger: c.log, Failed: "credential status not reconciled; retrying", Attrs: ctrl.Named[string]("peer"),
			Level: func(error) slog.Level { return slog.LevelDebug }},
	})
	if err != nil {
		return nil, fmt.Errorf("offload consumer: %w", err)
	}
	c.queue = c.ctrl.Queue()
	expiry := credentialExpiry{c: c, desc: prometheus.NewDesc("flotilla_grant_credential_expiry_timestamp_seconds",
		"Unix time when the credential a provider granted this cluster expires; the provider renews it well before, so one close to now means renewals stopped arriving.",
		[]string{"peer"}, nil)}
	if err := ctrl.Register(cfg.Metrics, expiry); err != nil {
		return nil, fmt.Errorf("offload consumer: metrics: %w", err)
	}
	return c, nil
}

// credentialExpiry exports when each held credential expires, read when
// scraped.
type credentialExpiry struct {
	c    *Consumer
	desc *prometheus.Desc
}

func (e credentialExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e credentialExpiry) Collect(ch chan<- prometheus.Metric) {
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	for id, g := range e.c.held {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(g.ExpiresAt.UnixMilli())/1000, id)
	}
}

// GrantReceived takes a sealed grant from the peering engine
// (peering.GrantReceiver). It never blocks.
func (c *Consumer) GrantReceived(from string, key ed25519.PublicKey, sealed []byte) {
	c.mu.Lock()
	c.incoming[from] = sealedGrant{key: key, sealed: sealed}
	c.mu.Unlock()
	c.queue.Add(from)
}

// PeerHandler enqueues the Peers whose spec changed (the admin's
// spec.offloadTo), or that were deleted.
func (c *Consumer) PeerHandler() toolscache.ResourceEventHandler {
	add := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(metav1.Object); ok && identity.ValidateClusterID(o.GetName()) == nil {
			c.queue.Add(o.GetName())
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

// Credential is the REST config of provider's API server with the
// credential it granted, and the grant; an error when none is held, it
// expired, or this cluster's admin has not accepted offloading there.
func (c *Consumer) Credential(provider string) (*rest.Config, grant.Grant, error) {
	c.mu.Lock()
	g, ok := c.held[provider]
	accepted := c.accepted[provider]
	c.mu.Unlock()
	if !ok {
		return nil, grant.Grant{}, fmt.Errorf("no credential from %s: it has not granted offloading to this cluster", provider)
	}
	if !accepted {
		return nil, grant.Grant{}, fmt.Errorf("the credential from %s is not used: this cluster's admin has not accepted offloading there "+
			"(spec.offloadTo: Accept on its Peer, or the agent's --offload-to=auto)", provider)
	}
	if !c.cfg.Now().Before(g.ExpiresAt) {
		return nil, grant.Grant{}, fmt.Errorf("the credential from %s expired at %s", provider, g.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return RestConfigOf(g), g, nil
}

func RestConfigOf(g grant.Grant) *rest.Config {
	return &rest.Config{
		Host: g.Server, BearerToken: g.Token.Reveal(),
		TLSClientConfig: rest.TLSClientConfig{CAData: g.CAData},
		Timeout:         10 * time.Second,
		// No client-side rate limit (client-go's default is 5 a second):
		// the provider's priority and fairness limits its tenants, and
		// a hundred namespaces offloaded at once are a hundred requests.
		QPS: -1, Burst: -1,
	}
}

// verifyCredential asks the provider who the credential is: it must
// authenticate as the consumer's account in its tenant namespace.
func verifyCredential(ctx context.Context, g grant.Grant) error {
	cs, err := authenticationv1client.NewForConfig(RestConfigOf(g))
	if err != nil {
		return fmt.Errorf("client for %s: %w", g.Server, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := cs.SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("the provider's API server at %s: %w", g.Server, err)
	}
	if want := offload.ConsumerUser(g.Consumer); r.Status.UserInfo.Username != want {
		return fmt.Errorf("the credential authenticates as %q at %s, not as %q", r.Status.UserInfo.Username, g.Server, want)
	}
	return nil
}

// Run loads the grants kept from before and reconciles until ctx ends.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	held, problems, err := c.cfg.Store.Load(c.cfg.Now())
	if err != nil {
		return fmt.Errorf("offload consumer: %w", err)
	}
	for _, p := range problems {
		c.log.Warn("a kept grant is not usable; the provider's next grant replaces it", "peer", p.Provider, "err", p.Err)
	}
	// Whether each kept grant is accepted, from its Peer as it is now:
	// what offloads asks for a credential at once, before the first
	// reconcile of its provider.
	accepted := map[string]bool{}
	for _, g := range held {
		var peer v1alpha1.Peer
		if err := c.cfg.Peers.Get(ctx, client.ObjectKey{Name: g.Provider}, &peer); err == nil {
			accepted[g.Provider], _ = c.cfg.Policy.accepts(&peer)
		}
	}
	c.mu.Lock()
	for _, g := range held {
		c.held[g.Provider] = g
		if accepted[g.Provider] {
			c.accepted[g.Provider] = true
		}
		c.queue.Add(g.Provider)
	}
	c.mu.Unlock()
	return c.ctrl.Run(ctx, nil)
}

// accept opens what arrived from id, if anything, and keeps it.
func (c *Consumer) accept(id string) {
	c.mu.Lock()
	in, ok := c.incoming[id]
	delete(c.incoming, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	g, change, err := c.cfg.Store.Accept(in.key, in.sealed, c.cfg.Now())
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		c.m.refused.WithLabelValues(refusal(err)).Inc()
		c.refused[id] = err
		c.log.Warn("grant refused", "peer", id, "err", err)
	case g.Revoked:
		delete(c.held, id)
		delete(c.refused, id)
		c.revoked[id] = true
		c.log.Info("grant revoked by the provider", "peer", id, "serial", g.Serial)
	case change != grant.Unchanged:
		c.held[id] = g
		delete(c.refused, id)
		delete(c.revoked, id)
		c.m.accepted.Inc()
		c.log.Info("credential received", "peer", id, "namespace", g.Namespace, "server", g.Server,
			"serial", g.Serial, "expires", g.ExpiresAt.UTC().Format(time.RFC3339))
	}
}

// reconcile takes what arrived, checks the credential held and writes
// the provider's Peer status; it returns when to look again.
func (c *Consumer) reconcile(ctx context.Context, id string) (time.Duration, error) {
	var peer v1alpha1.Peer
	err := c.cfg.Peers.Get(ctx, client.ObjectKey{Name: id}, &peer)
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("read Peer %s: %w", id, err)
	}
	found := err == nil
	var seen *v1alpha1.Peer
	if found {
		seen = &peer
	}
	accepted, declined := c.cfg.Policy.accepts(seen)
	early := c.checkEarly(ctx, id, accepted && found)
	defer early.wait()
	c.accept(id)
	c.mu.Lock()
	g, held := c.held[id]
	refused, revoked := c.refused[id], c.revoked[id]
	if accepted {
		c.accepted[id] = true
	} else {
		delete(c.accepted, id)
	}
	c.mu.Unlock()
	now := c.cfg.Now()
	var st offload.GrantCondition
	var after time.Duration
	switch {
	case held && !found:
		return time.Second, nil // the peering writes its Peer soon
	case held && declined == ReasonDeclined:
		st = offload.GrantCondition{Reason: declined, Message: fmt.Sprintf(
			"the peer granted offloading (namespace %s on %s); this cluster's admin declined it (spec.offloadTo: Deny): nothing is offloaded there",
			g.Namespace, g.Server)}
	case held && !accepted:
		st = offload.GrantCondition{Reason: declined, Message: fmt.Sprintf(
			"the peer granted offloading (namespace %s on %s); it is used once this cluster's admin accepts it: "+
				"kubectl patch peer %s --type=merge -p '{\"spec\":{\"offloadTo\":\"Accept\"}}' (or run the agent with --offload-to=auto)",
			g.Namespace, g.Server, id)}
	case held && !now.Before(g.ExpiresAt):
		st = offload.GrantCondition{Reason: "Expired", Message: fmt.Sprintf(
			"the credential expired at %s without a new one: the provider renews it before then, so it is unreachable or stopped granting",
			g.ExpiresAt.UTC().Format(time.RFC3339))}
	case held:
		st = offload.GrantCondition{Grant: &v1alpha1.GrantStatus{
			Namespace: g.Namespace, Server: g.Server, Limits: offload.LimitsStatus(g.Limits),
			Expires: &metav1.Time{Time: g.ExpiresAt.Truncate(time.Second)}}}
		if err := early.verify(ctx, g, c.cfg.Verify); err != nil {
			st.Reason, st.Message = "Unverified", "the credential does not work yet: "+err.Error()
			c.m.verifyErrors.Inc()
			after = 5 * time.Second
		} else {
			st.OK, st.Reason = true, "Ready"
			st.Message = fmt.Sprintf("a working credential for namespace %s on %s, expiring at %s",
				g.Namespace, g.Server, g.ExpiresAt.UTC().Format(time.RFC3339))
			after = g.ExpiresAt.Sub(now) // to say Expired if nothing new comes
		}
	case refused != nil:
		st = offload.GrantCondition{Reason: "Refused", Message: "a grant from the peer was refused: " + refused.Error()}
	case revoked:
		st = offload.GrantCondition{Reason: "Revoked", Message: "the peer revoked the grant"}
	default:
		return 0, nil
	}
	if held && refused != nil {
		// The credential held is still the one in use, but the peer's
		// newer grant was not taken: without this it would expire
		// unexplained.
		st.Message += "; the peer's latest grant was refused: " + refused.Error()
	}
	if !found {
		return time.Second, nil // the peering writes it soon
	}
	st.Kind = v1alpha1.ConditionOffloadCredential
	if !offload.Shows(&peer, st) {
		if err := offload.ApplyGrantStatus(ctx, c.cfg.Client, offload.ConsumerFieldOwner, id, &peer, st, now); err != nil {
			return 0, err
		}
	}
	return after, nil
}

// earlyCheck is the check of a new grant against its provider, started
// before the grant is kept in the ledger.
type earlyCheck struct {
	serial uint64
	done   chan struct{}
	err    error
}

// checkEarly starts checking the grant that arrived from id against the
// provider when this cluster uses id's grants (used) and the store would
// keep it: the request to the provider and the ledger's write then
// overlap. nil when nothing is checked.
func (c *Consumer) checkEarly(ctx context.Context, id string, used bool) *earlyCheck {
	if !used {
		return nil
	}
	c.mu.Lock()
	in, ok := c.incoming[id]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	g, change, err := c.cfg.Store.Check(in.key, in.sealed, c.cfg.Now())
	if err != nil || g.Revoked || change == grant.Unchanged || g.Provider != id {
		return nil // accept says why, or there is nothing new to check
	}
	e := &earlyCheck{serial: g.Serial, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		e.err = c.cfg.Verify(ctx, g)
	}()
	return e
}

// verify checks g against its provider: the early check's answer when it
// checked that very grant, else a check made now.
func (e *earlyCheck) verify(ctx context.Context, g grant.Grant, verify func(context.Context, grant.Grant) error) error {
	if e != nil && e.serial == g.Serial {
		<-e.done
		return e.err
	}
	return verify(ctx, g)
}

// wait returns once the early check, if any, has ended.
func (e *earlyCheck) wait() {
	if e != nil {
		<-e.done
	}
}

// refusal labels a refused grant in the metrics.
func refusal(err error) string {
	for _, r := range []struct {
		err   error
		label string
	}{
		{grant.ErrNotForUs, "not_for_us"}, {grant.ErrForged, "forged"}, {grant.ErrReplayed, "replayed"},
		{grant.ErrExpired, "expired"}, {grant.ErrMalformed, "malformed"},
	} {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "other"
}

type consumerMetrics struct {
	accepted, verifyErrors prometheus.Counter
	refused                *prometheus.CounterVec
}

func newConsumerMetrics(reg prometheus.Registerer) (*consumerMetrics, error) {
	m := &consumerMetrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_credentials_received_total", Help: "New credentials accepted from providers."}),
		verifyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_grant_credential_checks_failed_total", Help: "Checks of a held credential against its provider that failed."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_grant_refused_total", Help: "Sealed grants refused, by reason."}, []string{"reason"}),
	}
	return m, ctrl.Register(reg, m.accepted, m.verifyErrors, m.refused)
}
