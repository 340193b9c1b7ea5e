package tenancy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestGrants runs Grants on one real control plane and a remote.Consumer on
// another, the Peer CRD on both. Each subtest brings a provider and
// consumers of its own (fresh cluster IDs, so its Peers and tenants are
// its own); they run one after another, because Grants reconciles
// every tenant of its cluster.
func TestGrants(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	// The Peer caches log through controller-runtime, which otherwise
	// complains that nobody set its logger.
	ctrllog.SetLogger(logr.Discard())
	env := harness.New(t)
	cps := env.ControlPlanes(2, harness.ControlPlaneOptions{})
	w := &world{provCP: cps[0], consCP: cps[1], logs: &syncbuf.Buffer{}, tokens: &tokenLog{}}
	w.provClient, w.consClient = peerClient(t, cps[0].Config), peerClient(t, cps[1].Config)
	offloadtest.MustApplyCRDsTo(t, cps...)
	// The provider proves its fences as the agent does, with the agent's
	// own token against deploy/'s policies.
	offloadtest.InstallProvider(t, w.provCP)
	w.startFences(t)

	t.Run("Policy", w.testPolicy)
	t.Run("Grant", w.testGrant)
	t.Run("Rotation", w.testRotation)
	t.Run("Revocation", w.testRevocation)
	t.Run("Refusals", w.testRefusals)
	t.Run("ProviderRestart", w.testProviderRestart)
	t.Run("FencesMissing", w.testFencesMissing)
	t.Run("ConsumerOptIn", w.testConsumerOptIn)
	t.Run("NoTokenInLogsOrStatus", w.testNoToken)
}

// world is what the subtests share: the two clusters and everything the
// last subtest searches for tokens.
type world struct {
	provCP, consCP         *harness.ControlPlane
	provClient, consClient client.Client

	logs   *syncbuf.Buffer // every provider's, tenants' and consumer's log
	tokens *tokenLog       // every token the bridges carried
	// trace, when set, records the requests of the controllers of both
	// sides (a benchmark's).
	trace *harness.Trace

	fences *Fences

	mu         sync.Mutex
	peers      []string // the Peers, as JSON, just before each was deleted
	registries []*prometheus.Registry
	running    map[*Grants]bool // told when the fences change
}

// config is how the controllers of side reach cp: traced when w is.
func (w *world) config(cp *harness.ControlPlane, side string) *rest.Config {
	if w.trace == nil {
		return cp.Config
	}
	return w.trace.Wrap(cp.Config, side)
}

func (w *world) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (w *world) registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	w.mu.Lock()
	w.registries = append(w.registries, r)
	w.mu.Unlock()
	return r
}

// providerOptions are what the subtests vary in a provider.
type providerOptions struct {
	policy   GrantPolicy
	renewAt  float64
	grace    time.Duration
	lifetime time.Duration
}

// provider is Grants running against the provider's cluster, and what
// the test needs to restart it.
type provider struct {
	w       *world
	id      identity.Identity
	opts    providerOptions
	bridge  *bridge
	serials *ipam.Ledger
	tenants *Tenants
	p       *Grants
	stop    func()
}

// newProvider makes a provider identity of its own and starts Grants
// for it; the tenants of the consumers it knows go when t ends.
func (w *world) newProvider(t testing.TB, opts providerOptions) *provider {
	t.Helper()
	id := newIdentity(t)
	serials, err := ipam.Open(filepath.Join(t.TempDir(), "provider.db"), ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{w: w, id: id, opts: opts, bridge: newBridge(id, w.tokens), serials: serials}
	t.Cleanup(func() {
		// After the provider stopped (cleanups run last first).
		for _, c := range p.bridge.consumers() {
			if err := p.tenants.Remove(context.Background(), c); err != nil {
				t.Errorf("remove the tenant of %s: %v", c, err)
			}
		}
		serials.Close()
	})
	p.start(t)
	return p
}

// start runs a new Grants over the same identity, ledger and bridge.
func (p *provider) start(t testing.TB) {
	t.Helper()
	w := p.w
	lifetime := p.opts.lifetime
	if lifetime == 0 {
		lifetime = DefaultLifetime
	}
	cfg := TenantsConfig{
		Config: w.config(w.provCP, "provider"), Audience: offload.DefaultAudience, Lifetime: lifetime,
		Logger: w.logger(), Metrics: w.registry(),
	}
	if w.trace != nil {
		// As the agent's: its pod networks known, not read per tenant.
		cfg.PodNetworks = func(context.Context) ([]netip.Prefix, error) { return []netip.Prefix{offloadtest.ProviderPodCIDR}, nil }
	}
	tenants, err := NewTenants(cfg)
	if err != nil {
		t.Fatal(err)
	}
	scheme := peerScheme(t)
	peers, err := cache.New(w.config(w.provCP, "provider"), cache.Options{Scheme: scheme, Mapper: peerMapper(), DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		t.Fatal(err)
	}
	policy := p.opts.policy
	if policy == "" {
		policy = GrantsManual
	}
	prov, err := NewGrants(GrantsConfig{
		Identity: p.id, Peers: peers, Client: w.provClient, Tenants: tenants,
		APIServer: func(context.Context) (APIServer, error) {
			// The test process reaches the provider on loopback.
			return APIServer{URL: w.provCP.Config.Host, CAData: w.provCP.CA(), Source: SourceFlag}, nil
		},
		Sender: p.bridge, Serials: p.serials, Policy: policy, Grace: p.opts.grace, RenewAt: p.opts.renewAt,
		Fences: w.fences, Logger: w.logger(), Metrics: w.registry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inf, err := peers.GetInformer(ctx, &v1alpha1.Peer{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.AddEventHandler(prov.PeerHandler()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := peers.Start(ctx); err != nil {
			t.Errorf("Peer cache: %v", err)
		}
	})
	if !peers.WaitForCacheSync(ctx) {
		t.Fatal("the Peer cache did not sync")
	}
	wg.Go(func() {
		if err := prov.Run(ctx); err != nil {
			t.Errorf("provider: %v", err)
		}
	})
	var once sync.Once
	p.tenants, p.p = tenants, prov
	w.mu.Lock()
	w.running[prov] = true
	w.mu.Unlock()
	p.stop = func() {
		once.Do(func() {
			w.mu.Lock()
			delete(w.running, prov)
			w.mu.Unlock()
			cancel()
			wg.Wait()
		})
	}
	t.Cleanup(p.stop)
}

// startFences proves the provider's fences with the agent's own token
// and tells every Grants running when the verdict changes. The checks run
// when a subtest asks (Check), not on a timer.
func (w *world) startFences(t testing.TB) {
	bindings, err := deploy.AdmissionBindings()
	if err != nil {
		t.Fatal(err)
	}
	agent := kubernetes.NewForConfigOrDie(offloadtest.ServiceAccountConfig(t, w.provCP, "flotilla-system", "flotilla-agent"))
	w.running = map[*Grants]bool{}
	w.fences, err = NewFences(FencesConfig{
		Client: agent, Bindings: bindings,
		Changed: func(error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			for g := range w.running {
				g.FencesChanged()
			}
		},
		Logger: w.logger(), Metrics: w.registry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The policies take effect in the API server a moment after they are
	// created.
	eventually.Within(t, 30*time.Second, "the fences proven with the agent's token", func() error {
		return w.fences.Check(t.Context())
	})
}

// member tells the provider what the membership says of c.
func (p *provider) member(c identity.Identity, alive bool) {
	p.p.PeerChanged(peering.PeerState{ClusterID: c.ClusterID(), IdentityKey: c.Public(), Member: peering.Condition{OK: alive}})
}

// consumer is a remote.Consumer running against the consumer's cluster.
type consumer struct {
	id  identity.Identity
	c   *remote.Consumer
	reg *prometheus.Registry
}

// newConsumer starts a remote.Consumer of a new identity, the bridge of
// each provider given delivering to it, and a Peer for each provider on
// the consumer's cluster, whose admin accepts offloading there.
func (w *world) newConsumer(t testing.TB, providers ...*provider) *consumer {
	t.Helper()
	c := w.newConsumerWithoutPeer(t, providers...)
	for _, p := range providers {
		w.createPeer(t, w.consClient, p.id.ClusterID(), v1alpha1.PeerSpec{OffloadTo: v1alpha1.OffloadToAccept})
	}
	return c
}

// newConsumerWithoutPeer is newConsumer without the Peers: the
// remote.Consumer holds what it receives and waits to write its status.
func (w *world) newConsumerWithoutPeer(t testing.TB, providers ...*provider) *consumer {
	t.Helper()
	return w.startConsumer(t, remote.UseManual, providers...)
}

// startConsumer is newConsumerWithoutPeer under policy; like the agent's,
// the consumer hears of every change of a Peer's spec.
func (w *world) startConsumer(t testing.TB, policy remote.UsePolicy, providers ...*provider) *consumer {
	t.Helper()
	id := newIdentity(t)
	ledger, err := ipam.Open(filepath.Join(t.TempDir(), "consumer.db"), ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ledger.Close() })
	reg := w.registry()
	peers, err := cache.New(w.config(w.consCP, "consumer"), cache.Options{Scheme: peerScheme(t), Mapper: peerMapper(), DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		t.Fatal(err)
	}
	// A benchmark's consumer reads Peers from the cache, as the agent's
	// does; the tests' read them as written.
	var read client.Reader = w.consClient
	if w.trace != nil {
		read = peers
	}
	c, err := remote.NewConsumer(remote.ConsumerConfig{
		Store: grant.NewStore(id, ledger), Peers: read, Client: w.consClient,
		Policy: policy, Verify: w.verify(), Logger: w.logger(), Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inf, err := peers.GetInformer(ctx, &v1alpha1.Peer{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.AddEventHandler(c.PeerHandler()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := peers.Start(ctx); err != nil {
			t.Errorf("Peer cache: %v", err)
		}
	})
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, p := range providers {
		p.bridge.connect(id.ClusterID(), c)
	}
	return &consumer{id: id, c: c, reg: reg}
}

// verify is the consumer's check of a credential: its own (nil) unless
// w is traced, then the same SelfSubjectReview through a traced client.
func (w *world) verify() func(context.Context, grant.Grant) error {
	if w.trace == nil {
		return nil
	}
	return func(ctx context.Context, g grant.Grant) error {
		cs, err := authenticationv1client.NewForConfig(w.trace.Wrap(remote.RestConfigOf(g), "consumer@provider"))
		if err != nil {
			return err
		}
		r, err := cs.SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if want := offload.ConsumerUser(g.Consumer); r.Status.UserInfo.Username != want {
			return fmt.Errorf("the credential authenticates as %q, not as %q", r.Status.UserInfo.Username, want)
		}
		return nil
	}
}

// bridge stands in for the two peering engines: what the provider hands
// its engine for a consumer goes straight to that consumer, as its engine
// would deliver it. The carriage itself (the grant in the signed Hello,
// delivered once per new content) is tested in peering.
type bridge struct {
	from   identity.Identity
	tokens *tokenLog

	mu   sync.Mutex
	to   map[string]*remote.Consumer
	sent map[string][][]byte // every sealed grant handed over, by consumer
}

func newBridge(from identity.Identity, tokens *tokenLog) *bridge {
	return &bridge{from: from, tokens: tokens, to: map[string]*remote.Consumer{}, sent: map[string][][]byte{}}
}

func (b *bridge) connect(id string, c *remote.Consumer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.to[id] = c
}

// SetGrant is the GrantSender.
func (b *bridge) SetGrant(id string, sealed []byte) error {
	b.mu.Lock()
	c := b.to[id]
	if len(sealed) > 0 {
		b.sent[id] = append(b.sent[id], bytes.Clone(sealed))
	}
	b.mu.Unlock()
	if c != nil && len(sealed) > 0 {
		c.GrantReceived(b.from.ClusterID(), b.from.Public(), sealed)
	}
	return nil
}

// consumers are those the bridge connects or carried grants for.
func (b *bridge) consumers() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id := range b.sent {
		out = append(out, id)
	}
	for id := range b.to {
		if _, ok := b.sent[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// grants opens every grant carried for c, in order.
func (b *bridge) grants(t *testing.T, c identity.Identity) ([]grant.Grant, [][]byte) {
	t.Helper()
	b.mu.Lock()
	sealed := slices.Clone(b.sent[c.ClusterID()])
	b.mu.Unlock()
	var out []grant.Grant
	for _, s := range sealed {
		g, err := grant.Open(c, b.from.Public(), s)
		if err != nil {
			t.Fatalf("a grant the provider sealed does not open: %v", err)
		}
		if !g.Token.IsZero() {
			b.tokens.add(Token{Value: g.Token})
		}
		out = append(out, g)
	}
	return out, sealed
}

// last is the last grant carried for c; it waits for one.
func (b *bridge) last(t *testing.T, c identity.Identity) grant.Grant {
	t.Helper()
	var g grant.Grant
	eventually.Within(t, 30*time.Second, "a grant carried to "+c.ClusterID(), func() error {
		gs, _ := b.grants(t, c)
		if len(gs) == 0 {
			return errors.New("none yet")
		}
		g = gs[len(gs)-1]
		return nil
	})
	return g
}

// 1. Under manual policy a Peer that says nothing gets nothing; auto
// grants it; Grant and Deny decide under either.
func (w *world) testPolicy(t *testing.T) {
	for _, tc := range []struct {
		name       string
		policy     GrantPolicy
		offloading v1alpha1.Offloading
		granted    bool
		reason     string
	}{
		{"manual, empty", GrantsManual, v1alpha1.OffloadingDefault, false, "NotGranted"},
		{"manual, Grant", GrantsManual, v1alpha1.OffloadingGrant, true, "Granted"},
		{"auto, empty", GrantsAuto, v1alpha1.OffloadingDefault, true, "Granted"},
		{"auto, Deny", GrantsAuto, v1alpha1.OffloadingDeny, false, "Denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := w.newProvider(t, providerOptions{policy: tc.policy})
			c := w.newConsumer(t, p)
			w.createPeer(t, w.provClient, c.id.ClusterID(), v1alpha1.PeerSpec{Offloading: tc.offloading})
			p.member(c.id, true)
			// The condition is written after the tenant would have been
			// made: the witness for "nothing made".
			w.waitCondition(t, w.provClient, c.id.ClusterID(), v1alpha1.ConditionOffloadGranted, tc.granted, tc.reason)
			_, err := w.provCP.Client.CoreV1().Namespaces().Get(t.Context(), offload.TenantNamespace(c.id.ClusterID()), metav1.GetOptions{})
			switch {
			case tc.granted && err != nil:
				t.Errorf("tenant namespace: %v", err)
			case !tc.granted && !apierrors.IsNotFound(err):
				t.Errorf("tenant namespace of a peer not granted: %v, want NotFound", err)
			}
			if gs, _ := p.bridge.grants(t, c.id); !tc.granted && len(gs) != 0 {
				t.Errorf("%d grants sent to a peer not granted", len(gs))
			}
			if tc.reason == "NotGranted" {
				// Until the admin grants it.
				w.updatePeer(t, w.provClient, c.id.ClusterID(), func(peer *v1alpha1.Peer) { peer.Spec.Offloading = v1alpha1.OffloadingGrant })
				w.waitCondition(t, w.provClient, c.id.ClusterID(), v1alpha1.ConditionOffloadGranted, true, "Granted")
			} else if !tc.granted {
				return
			}
			w.waitCondition(t, w.consClient, p.id.ClusterID(), v1alpha1.ConditionOffloadCredential, true, "Ready")
			w.credentialWorks(t, c, p)
		})
	}
}

// 2. A granted consumer's Peer and the provider's both show the grant and
// its limits, the quota enforces them, and a change of limits reaches the
// consumer in a new grant.
func (w *world) testGrant(t *testing.T) {
	ctx := t.Context()
	p := w.newProvider(t, providerOptions{})
	c := w.newConsumer(t, p)
	cid := c.id.ClusterID()
	ns := offload.TenantNamespace(cid)
	w.createPeer(t, w.provClient, cid, v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant, OffloadLimits: &v1alpha1.OffloadLimits{
		CPU: quantity("2"), Memory: quantity("4Gi"), Pods: offloadtest.Ptr(int64(10)), Namespaces: offloadtest.Ptr(int64(3)),
	}})
	p.member(c.id, true)

	for _, step := range []struct {
		limits grant.Limits
		quota  []string
	}{
		{grant.Limits{CPU: "2", Memory: "4Gi", Pods: 10, Namespaces: 3}, []string{"requests.cpu", "2", "requests.memory", "4Gi", "pods", "10"}},
		{grant.Limits{CPU: "500m", Pods: 20}, []string{"requests.cpu", "500m", "pods", "20"}},
	} {
		if step.limits.Pods == 20 {
			before := p.bridge.last(t, c.id).Serial
			w.updatePeer(t, w.provClient, cid, func(peer *v1alpha1.Peer) {
				peer.Spec.OffloadLimits = &v1alpha1.OffloadLimits{CPU: quantity("500m"), Pods: offloadtest.Ptr(int64(20))}
			})
			eventually.Within(t, 30*time.Second, "a new grant with the new limits", func() error {
				if g := p.bridge.last(t, c.id); g.Serial <= before || g.Limits != step.limits {
					return fmt.Errorf("serial %d (was %d), limits %+v", g.Serial, before, g.Limits)
				}
				return nil
			})
		}
		want := offload.LimitsStatus(step.limits)
		provPeer := w.waitPeer(t, w.provClient, cid, "OffloadGranted True Granted with the limits", func(peer *v1alpha1.Peer) error {
			if err := hasCondition(peer, v1alpha1.ConditionOffloadGranted, true, "Granted"); err != nil {
				return err
			}
			return sameGrantStatus(peer.Status.Offloading, false, ns, w.provCP.Config.Host, want)
		})
		if cond := meta.FindStatusCondition(provPeer.Status.Conditions, v1alpha1.ConditionOffloadGranted); cond.ObservedGeneration != provPeer.Generation {
			t.Errorf("OffloadGranted observedGeneration %d, Peer generation %d", cond.ObservedGeneration, provPeer.Generation)
		}
		consPeer := w.waitPeer(t, w.consClient, p.id.ClusterID(), "OffloadCredential True Ready with the limits", func(peer *v1alpha1.Peer) error {
			if err := hasCondition(peer, v1alpha1.ConditionOffloadCredential, true, "Ready"); err != nil {
				return err
			}
			return sameGrantStatus(peer.Status.Offloading, true, ns, w.provCP.Config.Host, want)
		})
		g := p.bridge.last(t, c.id)
		for side, exp := range map[string]*metav1.Time{"provider": provPeer.Status.Offloading.Granted.Expires, "consumer": consPeer.Status.Offloading.Received.Expires} {
			if exp == nil || !exp.Time.Equal(g.ExpiresAt.Truncate(time.Second)) {
				t.Errorf("%s's Peer: expires %v, want the grant's %v", side, exp, g.ExpiresAt)
			}
		}
		if life := g.ExpiresAt.Sub(g.IssuedAt); life < DefaultLifetime-time.Minute || life > DefaultLifetime+time.Minute {
			t.Errorf("grant lives %v, want about %v", life, DefaultLifetime)
		}
		q, err := w.provCP.Client.CoreV1().ResourceQuotas(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !sameResources(q.Spec.Hard, counted(step.quota...)) {
			t.Errorf("limits %+v: quota %v, want %v", step.limits, q.Spec.Hard, counted(step.quota...))
		}
		w.credentialWorks(t, c, p)
		if got, want := credentialExpiryMetric(t, c.reg, p.id.ClusterID()), float64(g.ExpiresAt.UnixMilli())/1000; got != want {
			t.Errorf("flotilla_grant_credential_expiry_timestamp_seconds %v, want the grant's expiry %v", got, want)
		}
	}

	// The admin raises an object count: the quota follows, and the
	// consumer is sent nothing (the fence is the provider's own).
	before := p.bridge.last(t, c.id).Serial
	w.updatePeer(t, w.provClient, cid, func(peer *v1alpha1.Peer) {
		peer.Spec.OffloadLimits = &v1alpha1.OffloadLimits{CPU: quantity("500m"), Pods: offloadtest.Ptr(int64(20)), Services: offloadtest.Ptr(int64(7))}
	})
	want := counted("requests.cpu", "500m", "pods", "20")
	want[corev1.ResourceServices] = resource.MustParse("7")
	eventually.Within(t, 30*time.Second, "the quota with the raised count", func() error {
		q, err := w.provCP.Client.CoreV1().ResourceQuotas(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !sameResources(q.Spec.Hard, want) {
			return fmt.Errorf("quota %v, want %v", q.Spec.Hard, want)
		}
		return nil
	})
	if g := p.bridge.last(t, c.id); g.Serial != before || g.Limits.Fence != (grant.Fence{}) {
		t.Errorf("after an object count changed, the consumer was sent serial %d (was %d) with fence %+v: want nothing new", g.Serial, before, g.Limits.Fence)
	}
}

// credentialExpiryMetric is what a consumer's metrics say of the expiry of
// the credential from provider; 0 if nothing.
func credentialExpiryMetric(t *testing.T, reg *prometheus.Registry, provider string) float64 {
	t.Helper()
	m := offloadtest.MetricOf(t, reg, "flotilla_grant_credential_expiry_timestamp_seconds", map[string]string{"peer": provider})
	return m.GetGauge().GetValue()
}

// 3. A renewed grant arrives with a higher serial and works at once; the
// token it replaces works on until it expires.
func (w *world) testRotation(t *testing.T) {
	// Renewed 6 s into a 10 min life.
	p := w.newProvider(t, providerOptions{renewAt: 0.01, lifetime: 10 * time.Minute})
	c := w.newConsumer(t, p)
	w.createPeer(t, w.provClient, c.id.ClusterID(), v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
	p.member(c.id, true)
	first := p.bridge.last(t, c.id)
	var second grant.Grant
	eventually.Within(t, 30*time.Second, "a renewed grant", func() error {
		second = p.bridge.last(t, c.id)
		if second.Serial == first.Serial {
			return errors.New("still the first")
		}
		return nil
	})
	if second.Serial < first.Serial || second.Token.Equal(first.Token) {
		t.Fatalf("renewed grant: serial %d after %d, same token %v", second.Serial, first.Serial, second.Token.Equal(first.Token))
	}
	eventually.Within(t, 10*time.Second, "the consumer holds the renewed grant", func() error {
		_, held, err := c.c.Credential(p.id.ClusterID())
		if err != nil {
			return err
		}
		if held.Serial < second.Serial {
			return fmt.Errorf("holds serial %d", held.Serial)
		}
		return nil
	})
	cfg, held, err := c.c.Credential(p.id.ClusterID())
	if err != nil {
		t.Fatal(err)
	}
	if user, err := userOf(t.Context(), cfg); err != nil || user != offload.ConsumerUser(c.id.ClusterID()) {
		t.Errorf("the renewed credential (serial %d): user %q, %v", held.Serial, user, err)
	}
	if user, err := w.tokenUser(t.Context(), first.Token); err != nil || user != offload.ConsumerUser(c.id.ClusterID()) {
		t.Errorf("the first token after renewal: user %q, %v; want it to work until it expires", user, err)
	}
}

// 4. Every way a grant ends removes the tenant, makes its tokens 401 and
// tells the consumer; a member back from beyond the grace period is
// granted again.
// With a policy's binding deleted the provider finds its fences no
// longer in force: it holds back the credential of the peer it granted,
// says why on the Peer and in Ready, and grants again once the binding
// is back.
func (w *world) testFencesMissing(t *testing.T) {
	ctx := t.Context()
	p := w.newProvider(t, providerOptions{})
	c := w.newConsumer(t, p)
	cid := c.id.ClusterID()
	w.createPeer(t, w.provClient, cid, v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
	p.member(c.id, true)
	// The positive witness: granted while the fences stand.
	w.waitCondition(t, w.provClient, cid, v1alpha1.ConditionOffloadGranted, true, "Granted")
	sent := p.bridge.last(t, c.id).Serial
	if err := p.p.Ready(); err != nil {
		t.Fatalf("not ready while granting with the fences in force: %v", err)
	}

	const policy = "flotilla-agent-namespaces"
	bindings := w.provCP.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	binding, err := bindings.Get(ctx, policy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding.ResourceVersion, binding.UID, binding.ManagedFields = "", "", nil
	restore := func() error {
		_, err := bindings.Create(context.Background(), binding, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	t.Cleanup(func() {
		if err := restore(); err != nil {
			t.Errorf("put back the binding %s: %v", policy, err)
		}
	})
	if err := bindings.Delete(ctx, policy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.fences.Check(ctx); err == nil || !strings.Contains(err.Error(), policy) {
		t.Fatalf("fences checked without the binding %s: %v, want an error naming it", policy, err)
	}
	peer := w.waitCondition(t, w.provClient, cid, v1alpha1.ConditionOffloadGranted, false, v1alpha1.ReasonFencesNotEnforced)
	if cond := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadGranted); !strings.Contains(cond.Message, policy) {
		t.Errorf("the Peer's condition does not say which policy is missing: %s", cond.Message)
	}
	if err := p.p.Ready(); err == nil || !strings.Contains(err.Error(), policy) {
		t.Errorf("Ready while a granted peer is held back: %v, want an error naming %s", err, policy)
	}
	if _, ok := p.p.Granted(cid); ok {
		t.Error("Granted still says yes while the credential is held back")
	}
	if got := p.bridge.last(t, c.id).Serial; got != sent {
		t.Errorf("a credential (serial %d) was sent while the fences were down; the last before was %d", got, sent)
	}

	if err := restore(); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "the fences proven again", func() error {
		return w.fences.Check(ctx)
	})
	w.waitCondition(t, w.provClient, cid, v1alpha1.ConditionOffloadGranted, true, "Granted")
	if err := p.p.Ready(); err != nil {
		t.Errorf("not ready once granting again: %v", err)
	}
}

func (w *world) testRevocation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    func(t *testing.T, p *provider, c *consumer)
		reason string // on the provider's Peer; none when it is gone
		back   func(t *testing.T, p *provider, c *consumer)
	}{
		{"Deny", func(t *testing.T, p *provider, c *consumer) {
			w.updatePeer(t, w.provClient, c.id.ClusterID(), func(peer *v1alpha1.Peer) { peer.Spec.Offloading = v1alpha1.OffloadingDeny })
		}, "Denied", nil},
		{"Peer deleted", func(t *testing.T, p *provider, c *consumer) {
			w.deletePeer(t, w.provClient, c.id.ClusterID())
		}, "", nil},
		{"member gone past the grace period", func(t *testing.T, p *provider, c *consumer) {
			p.member(c.id, false)
		}, "PeerGone", func(t *testing.T, p *provider, c *consumer) {
			p.member(c.id, true)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			p := w.newProvider(t, providerOptions{grace: 2 * time.Second})
			c := w.newConsumer(t, p)
			cid, ns := c.id.ClusterID(), offload.TenantNamespace(c.id.ClusterID())
			w.createPeer(t, w.provClient, cid, v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
			p.member(c.id, true)
			w.waitCondition(t, w.consClient, p.id.ClusterID(), v1alpha1.ConditionOffloadCredential, true, "Ready")
			granted := p.bridge.last(t, c.id)
			// In use just before, as a consumer's would be: the API server
			// caches it as authenticated for 10 s.
			if _, err := w.tokenUser(ctx, granted.Token); err != nil {
				t.Fatal(err)
			}

			tc.end(t, p, c)
			if tc.reason != "" {
				w.waitCondition(t, w.provClient, cid, v1alpha1.ConditionOffloadGranted, false, tc.reason)
			}
			consPeer := w.waitCondition(t, w.consClient, p.id.ClusterID(), v1alpha1.ConditionOffloadCredential, false, "Revoked")
			if off := consPeer.Status.Offloading; off != nil && off.Received != nil {
				t.Errorf("the consumer's Peer still shows the grant: %+v", off.Received)
			}
			if tc.reason != "" {
				var provPeer v1alpha1.Peer
				if err := w.provClient.Get(ctx, client.ObjectKey{Name: cid}, &provPeer); err != nil {
					t.Fatal(err)
				}
				if off := provPeer.Status.Offloading; off != nil && off.Granted != nil {
					t.Errorf("the provider's Peer still shows the grant: %+v", off.Granted)
				}
			}
			if revocation := p.bridge.last(t, c.id); !revocation.Revoked || revocation.Serial <= granted.Serial {
				t.Errorf("last grant carried: revoked %v, serial %d after %d", revocation.Revoked, revocation.Serial, granted.Serial)
			}
			if _, _, err := c.c.Credential(p.id.ClusterID()); err == nil || !strings.Contains(err.Error(), "no credential from") {
				t.Errorf("Credential after revocation: %v, want none held", err)
			}
			if got := credentialExpiryMetric(t, c.reg, p.id.ClusterID()); got != 0 {
				t.Errorf("flotilla_grant_credential_expiry_timestamp_seconds %v after revocation, want no series", got)
			}
			if _, err := w.provCP.Client.CoreV1().Secrets(ns).Get(ctx, offload.GrantSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the grant Secret after revocation: %v, want NotFound", err)
			}
			eventually.Within(t, 15*time.Second, "401 for the revoked token", func() error {
				_, err := w.tokenUser(ctx, granted.Token)
				if apierrors.IsUnauthorized(err) {
					return nil
				}
				return fmt.Errorf("still %v", err)
			})
			w.waitGone(t, ns)
			if tc.back == nil {
				return
			}
			tc.back(t, p, c)
			w.waitCondition(t, w.provClient, cid, v1alpha1.ConditionOffloadGranted, true, "Granted")
			w.waitCondition(t, w.consClient, p.id.ClusterID(), v1alpha1.ConditionOffloadCredential, true, "Ready")
			if again := p.bridge.last(t, c.id); again.Revoked || again.Serial <= granted.Serial {
				t.Errorf("granted again: revoked %v, serial %d", again.Revoked, again.Serial)
			}
			w.credentialWorks(t, c, p)
		})
	}
}

// 5. What fails the consumer's checks is refused, counted and said, and
// the credential held stays as it was.
func (w *world) testRefusals(t *testing.T) {
	p := w.newProvider(t, providerOptions{})
	c := w.newConsumer(t, p)
	cid, pid := c.id.ClusterID(), p.id.ClusterID()
	w.createPeer(t, w.provClient, cid, v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
	p.member(c.id, true)
	first := p.bridge.last(t, c.id)
	// A second grant, so that the first is an old one.
	w.updatePeer(t, w.provClient, cid, func(peer *v1alpha1.Peer) {
		peer.Spec.OffloadLimits = &v1alpha1.OffloadLimits{Pods: offloadtest.Ptr(int64(7))}
	})
	eventually.Within(t, 30*time.Second, "the consumer holds the second grant", func() error {
		if _, g, err := c.c.Credential(pid); err != nil || g.Serial == first.Serial {
			return fmt.Errorf("serial %d, %v", g.Serial, err)
		}
		return nil
	})
	w.waitCondition(t, w.consClient, pid, v1alpha1.ConditionOffloadCredential, true, "Ready")
	_, held, _ := c.c.Credential(pid)
	_, sealed := p.bridge.grants(t, c.id)

	other := newIdentity(t)
	forOther := sealGrant(t, p.id, other, w.provCP.Config.Host, w.provCP.CA(), first.Token)
	byOther := sealGrant(t, other, c.id, w.provCP.Config.Host, w.provCP.CA(), first.Token)
	tampered := bytes.Clone(sealed[len(sealed)-1])
	tampered[len(tampered)/2] ^= 0x20

	// Consecutive cases differ in reason, so each message is new.
	for _, tc := range []struct {
		name   string
		sealed []byte
		label  string
		says   string
	}{
		{"tampered", tampered, "not_for_us", "does not open with this cluster's identity"},
		{"replayed older", sealed[0], "replayed", "replayed or stale grant: serial"},
		{"sealed to another cluster", forOther, "not_for_us", "does not open with this cluster's identity"},
		{"from another provider than the sender", byOther, "forged", "grant not from that provider"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := offloadtest.MetricOf(t, c.reg, "flotilla_grant_refused_total", map[string]string{"reason": tc.label}).GetCounter().GetValue()
			c.c.GrantReceived(pid, p.id.Public(), tc.sealed)
			eventually.Within(t, 10*time.Second, "the refusal counted", func() error {
				if got := offloadtest.MetricOf(t, c.reg, "flotilla_grant_refused_total", map[string]string{"reason": tc.label}).GetCounter().GetValue(); got != before+1 {
					return fmt.Errorf("flotilla_grant_refused_total{reason=%q} = %v, was %v", tc.label, got, before)
				}
				return nil
			})
			// The credential held still works, so the condition stays
			// Ready; its message says what was refused.
			w.waitPeer(t, w.consClient, pid, "the refusal said", func(peer *v1alpha1.Peer) error {
				if err := hasCondition(peer, v1alpha1.ConditionOffloadCredential, true, "Ready"); err != nil {
					return err
				}
				cond := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadCredential)
				if !strings.Contains(cond.Message, "refused") || !strings.Contains(cond.Message, tc.says) {
					return fmt.Errorf("message %q", cond.Message)
				}
				return nil
			})
			if _, now, err := c.c.Credential(pid); err != nil || now.Serial != held.Serial || !now.Token.Equal(held.Token) {
				t.Errorf("the credential held after a refused grant: serial %d (was %d), same token %v, %v",
					now.Serial, held.Serial, now.Token.Equal(held.Token), err)
			}
		})
	}

	// From a provider nothing is held from, a refusal is the condition.
	t.Run("nothing held", func(t *testing.T) {
		q := newIdentity(t)
		w.createPeer(t, w.consClient, q.ClusterID(), v1alpha1.PeerSpec{})
		bad := sealGrant(t, q, c.id, w.provCP.Config.Host, w.provCP.CA(), first.Token)
		bad[len(bad)/2] ^= 0x20
		c.c.GrantReceived(q.ClusterID(), q.Public(), bad)
		peer := w.waitCondition(t, w.consClient, q.ClusterID(), v1alpha1.ConditionOffloadCredential, false, "Refused")
		if cond := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadCredential); !strings.Contains(cond.Message, "does not open with this cluster's identity") {
			t.Errorf("Refused message %q, want the reason", cond.Message)
		}
		if peer.Status.Offloading != nil && peer.Status.Offloading.Received != nil {
			t.Errorf("status.offloading.received %+v for a refused grant", peer.Status.Offloading.Received)
		}
		if _, _, err := c.c.Credential(q.ClusterID()); err == nil {
			t.Error("a credential from a refused grant")
		}
	})
}

// 6. A provider that restarts finds its tenants by their labels: those
// whose Peer went or denies while it was down are removed and their
// consumers told; the one still granted stays.
func (w *world) testProviderRestart(t *testing.T) {
	ctx := t.Context()
	p := w.newProvider(t, providerOptions{})
	// Three consumers on one cluster would share its Peer for p: they
	// go without, and their Credential tells (under --offload-to=auto,
	// which no Peer overrides).
	deleted, denied, kept := w.startConsumer(t, remote.UseAuto, p), w.startConsumer(t, remote.UseAuto, p), w.startConsumer(t, remote.UseAuto, p)
	for _, c := range []*consumer{deleted, denied, kept} {
		w.createPeer(t, w.provClient, c.id.ClusterID(), v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
		p.member(c.id, true)
	}
	for _, c := range []*consumer{deleted, denied, kept} {
		w.waitCondition(t, w.provClient, c.id.ClusterID(), v1alpha1.ConditionOffloadGranted, true, "Granted")
	}
	keptNS, err := w.provCP.Client.CoreV1().Namespaces().Get(ctx, offload.TenantNamespace(kept.id.ClusterID()), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keptSerial := p.bridge.last(t, kept.id).Serial

	p.stop()
	w.deletePeer(t, w.provClient, deleted.id.ClusterID())
	w.updatePeer(t, w.provClient, denied.id.ClusterID(), func(peer *v1alpha1.Peer) { peer.Spec.Offloading = v1alpha1.OffloadingDeny })
	// The membership reports the deleted Peer's member before the new
	// provider runs, and the denied one's only after its tenant went.
	p.start(t)
	p.member(deleted.id, true)
	p.member(kept.id, true)

	w.waitGone(t, offload.TenantNamespace(deleted.id.ClusterID()))
	w.waitGone(t, offload.TenantNamespace(denied.id.ClusterID()))
	w.waitCondition(t, w.provClient, denied.id.ClusterID(), v1alpha1.ConditionOffloadGranted, false, "Denied")
	p.member(denied.id, true)
	w.waitCondition(t, w.provClient, kept.id.ClusterID(), v1alpha1.ConditionOffloadGranted, true, "Granted")
	eventually.Within(t, 30*time.Second, "the kept consumer holds the new provider's grant", func() error {
		if _, g, err := kept.c.Credential(p.id.ClusterID()); err != nil || g.Serial <= keptSerial {
			return fmt.Errorf("serial %d (before the restart %d), %v", g.Serial, keptSerial, err)
		}
		return nil
	})
	for name, c := range map[string]*consumer{"deleted": deleted, "denied": denied} {
		eventually.Within(t, 30*time.Second, "the "+name+" consumer told", func() error {
			if _, g, err := c.c.Credential(p.id.ClusterID()); err == nil {
				return fmt.Errorf("still holds the grant of serial %d", g.Serial)
			} else if !strings.Contains(err.Error(), "no credential from") {
				return err
			}
			return nil
		})
		if g := p.bridge.last(t, c.id); !g.Revoked {
			t.Errorf("the last grant carried to the %s consumer: serial %d, not a revocation", name, g.Serial)
		}
	}
	ns, err := w.provCP.Client.CoreV1().Namespaces().Get(ctx, keptNS.Name, metav1.GetOptions{})
	if err != nil || ns.UID != keptNS.UID || ns.DeletionTimestamp != nil {
		t.Errorf("the kept tenant after the restart: %v, uid %s (was %s)", err, ns.UID, keptNS.UID)
	}
	w.credentialWorks(t, kept, p)
}

// 7. No token shows in any log line, Peer or metric of the whole run.
func (w *world) testNoToken(t *testing.T) {
	if n := w.tokens.count(); n < 10 {
		t.Fatalf("only %d tokens carried: nothing much was checked", n)
	}
	logs := w.logs.String()
	if !strings.Contains(logs, `"msg":"credential granted"`) || !strings.Contains(logs, `"msg":"credential received"`) {
		t.Fatal("the logs hold no grant: nothing was checked")
	}
	w.mu.Lock()
	peers := strings.Join(w.peers, "\n")
	regs := slices.Clone(w.registries)
	w.mu.Unlock()
	if !strings.Contains(peers, `"offloading":{"received"`) || !strings.Contains(peers, `"granted"`) {
		t.Fatal("no Peer with a grant in its status was kept: nothing was checked")
	}
	var metrics strings.Builder
	for _, r := range regs {
		b, err := testutil.CollectAndFormat(r, expfmt.TypeTextPlain)
		if err != nil {
			t.Fatal(err)
		}
		metrics.Write(b)
	}
	for where, text := range map[string]string{"logs": logs, "Peers": peers, "metrics": metrics.String()} {
		if i := strings.Index(text, offloadtest.JWTHeader); i >= 0 {
			t.Errorf("a token in the %s: ...%s...", where, text[max(0, i-80):i])
		}
		w.tokens.check(t, where, text)
	}
}

// credentialWorks: the consumer's credential from p authenticates as the
// consumer at p's API server.
func (w *world) credentialWorks(t *testing.T, c *consumer, p *provider) {
	t.Helper()
	cfg, _, err := c.c.Credential(p.id.ClusterID())
	if err != nil {
		t.Fatal(err)
	}
	if user, err := userOf(t.Context(), cfg); err != nil || user != offload.ConsumerUser(c.id.ClusterID()) {
		t.Errorf("the consumer's credential: user %q, %v; want %q", user, err, offload.ConsumerUser(c.id.ClusterID()))
	}
}

// tokenUser is who the provider's API server says tok is.
func (w *world) tokenUser(ctx context.Context, tok grant.Token) (string, error) {
	cfg := rest.AnonymousClientConfig(w.provCP.Config)
	cfg.BearerToken = tok.Reveal()
	return userOf(ctx, cfg)
}

func userOf(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return r.Status.UserInfo.Username, nil
}

// sealGrant seals from provider to consumer a grant like the providers'.
func sealGrant(t *testing.T, provider, consumer identity.Identity, server string, ca []byte, tok grant.Token) []byte {
	t.Helper()
	now := time.Now()
	s, err := grant.Seal(provider, consumer.Public(), grant.Grant{
		Provider: provider.ClusterID(), Consumer: consumer.ClusterID(), Serial: uint64(now.UnixNano()),
		IssuedAt: now, ExpiresAt: now.Add(time.Hour), Server: server, CAData: ca, Token: tok,
		Namespace: offload.TenantNamespace(consumer.ClusterID()),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// createPeer creates Peer name with spec; it is kept as JSON and deleted
// when t ends.
func (w *world) createPeer(t testing.TB, c client.Client, name string, spec v1alpha1.PeerSpec) {
	t.Helper()
	peer := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if err := c.Create(t.Context(), peer); err != nil {
		t.Fatalf("create Peer %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		var got v1alpha1.Peer
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &got); err == nil {
			b, _ := json.Marshal(&got)
			w.mu.Lock()
			w.peers = append(w.peers, string(b))
			w.mu.Unlock()
		}
		if err := c.Delete(ctx, peer); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Peer %s: %v", name, err)
		}
	})
}

func (w *world) updatePeer(t testing.TB, c client.Client, name string, change func(*v1alpha1.Peer)) {
	t.Helper()
	// The status writers update the object too: read again on a conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var peer v1alpha1.Peer
		if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &peer); err != nil {
			return err
		}
		change(&peer)
		return c.Update(t.Context(), &peer)
	})
	if err != nil {
		t.Fatalf("update Peer %s: %v", name, err)
	}
}

func (w *world) deletePeer(t *testing.T, c client.Client, name string) {
	t.Helper()
	var peer v1alpha1.Peer
	if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &peer); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(&peer)
	w.mu.Lock()
	w.peers = append(w.peers, string(b))
	w.mu.Unlock()
	if err := c.Delete(t.Context(), &peer); err != nil {
		t.Fatal(err)
	}
}

// waitPeer waits until Peer name passes check, and returns it.
func (w *world) waitPeer(t testing.TB, c client.Client, name, what string, check func(*v1alpha1.Peer) error) *v1alpha1.Peer {
	t.Helper()
	var peer v1alpha1.Peer
	eventually.Within(t, 30*time.Second, "Peer "+name+": "+what, func() error {
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &peer); err != nil {
			return err
		}
		return check(&peer)
	})
	return &peer
}

func (w *world) waitCondition(t testing.TB, c client.Client, name, kind string, ok bool, reason string) *v1alpha1.Peer {
	t.Helper()
	return w.waitPeer(t, c, name, fmt.Sprintf("%s %v %s", kind, ok, reason), func(peer *v1alpha1.Peer) error {
		return hasCondition(peer, kind, ok, reason)
	})
}

func hasCondition(peer *v1alpha1.Peer, kind string, ok bool, reason string) error {
	cond := meta.FindStatusCondition(peer.Status.Conditions, kind)
	if cond == nil {
		return fmt.Errorf("no %s condition", kind)
	}
	if (cond.Status == metav1.ConditionTrue) != ok || cond.Reason != reason {
		return fmt.Errorf("%s %s %s: %s", kind, cond.Status, cond.Reason, cond.Message)
	}
	return nil
}

// sameGrantStatus checks one side's half of status.offloading.
func sameGrantStatus(off *v1alpha1.OffloadingStatus, received bool, ns, server string, limits *v1alpha1.OffloadLimits) error {
	if off == nil {
		return errors.New("no status.offloading")
	}
	g := off.Granted
	if received {
		g = off.Received
	}
	switch {
	case g == nil:
		return fmt.Errorf("status.offloading %+v without this side's half", off)
	case g.Namespace != ns || g.Server != server:
		return fmt.Errorf("namespace %s on %s, want %s on %s", g.Namespace, g.Server, ns, server)
	case g.Expires == nil || !g.Expires.After(time.Now()):
		return fmt.Errorf("expires %v, want a time to come", g.Expires)
	case !sameLimits(g.Limits, limits):
		return fmt.Errorf("limits %s, want %s", limitsString(g.Limits), limitsString(limits))
	}
	return nil
}

func sameLimits(a, b *v1alpha1.OffloadLimits) bool { return limitsString(a) == limitsString(b) }

func limitsString(l *v1alpha1.OffloadLimits) string {
	if l == nil {
		return "none"
	}
	return fmt.Sprintf("%+v", offload.LimitsOf(l))
}

// waitGone waits until namespace ns is deleted.
func (w *world) waitGone(t testing.TB, ns string) {
	t.Helper()
	eventually.Within(t, 60*time.Second, "namespace "+ns+" deleted", func() error {
		_, err := w.provCP.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

func newIdentity(t testing.TB) identity.Identity {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func peerScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// peerMapper knows where Peers are served, as the agent's does: asking
// discovery right after the CRD is established may not find them yet.
func peerMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	return m
}

func peerClient(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: peerScheme(t), Mapper: peerMapper()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
