package mcs

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
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/peering"
)

// Views says how this cluster addresses another's pods (offload.Views;
// the agent implements it over its ledger).
type Views interface {
	Translate(cluster string, addr netip.Addr) (netip.Addr, bool)
}

// SerialStore keeps the last serial of this cluster's exports
// (*ipam.Ledger), so that a restarted exporter's snapshots are newer than
// the ones its peers hold.
type SerialStore interface {
	LoadOrCreateKey(name string, create func() ([]byte, error)) ([]byte, error)
	PutKey(name string, value []byte) error
}

// Config is what Services needs.
type Config struct {
	Config   *rest.Config
	Identity identity.Identity
	// Send delivers one message to a peer (discovery.SendServices).
	Send    func(ctx context.Context, to string, msg []byte) error
	Views   Views
	Serials SerialStore
	// Grace is how long a peer may be other than Connected before its
	// exports are withdrawn here; and, after a start, how long imports of
	// clusters not heard from yet are kept. Default 2 minutes.
	Grace time.Duration
	// Resync is how often the exports are sent again to every Connected
	// peer, so that a restarted peer converges. Default 30 s.
	Resync time.Duration
	// Debounce gathers changes before a snapshot is sent. Default 20 ms.
	Debounce time.Duration
	// MaxMessageLen bounds a message; default 64 KiB (discovery's).
	MaxMessageLen int
	Now           func() time.Time
	// Shared, when set, is where Namespaces, Services, EndpointSlices
	// and ServiceExports are read from (the agent's offload.SharedCache)
	// instead of informers of the exporter's own.
	Shared  *offload.SharedCache
	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Services runs the Multi-Cluster Services API in this cluster: it
// exports the Services of the ServiceExports here to every Connected peer,
// and imports what the peers export (docs/services.md).
type Services struct {
	cfg   Config
	self  string
	log   *slog.Logger
	cache cache.Cache
	c     client.Client

	inbound chan []byte
	wake    chan struct{} // a local change to export
	connect chan string   // a peer just became Connected

	// importer reconciles the ServiceImports queued on imports;
	// exportStatuses writes the status of those queued on exports.
	importer, exportStatuses *ctrl.Controller[key]
	imports, exports         ctrl.Queue[key]

	mu        sync.Mutex
	members   map[string]member
	inbox     *Inbox
	snapshots map[string]Snapshot // by cluster, this one's too
	started   time.Time
	exported  bool // this cluster's first snapshot is built
	messages  [][]byte
	serial    uint64
	foreign   map[key]bool // ServiceImports not ours, logged once

	metrics *metrics
}

// key is a (namespace, name) in this cluster.
type key struct{ Namespace, Name string }

func (k key) String() string { return k.Namespace + "/" + k.Name }

type member struct {
	key       ed25519.PublicKey
	connected bool
	goneSince time.Time
}

// New prepares Services; Run starts it.
func New(cfg Config) (*Services, error) {
	if cfg.Config == nil || cfg.Send == nil || cfg.Views == nil || cfg.Serials == nil || cfg.Identity.Private == nil {
		return nil, errors.New("mcs: config, identity, send, views and serials are required")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 2 * time.Minute
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 20 * time.Millisecond
	}
	if cfg.MaxMessageLen <= 0 {
		cfg.MaxMessageLen = 64 << 10
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	scheme := Scheme()
	ca, err := cache.New(cfg.Config, cache.Options{Scheme: scheme, Mapper: mapper(), DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("mcs: cache: %w", err)
	}
	ca = offload.WithShared(ca, cfg.Shared,
		offload.SharedNamespaces, offload.SharedServices, offload.SharedEndpointSlices, offload.SharedServiceExports)
	c, err := client.New(cfg.Config, client.Options{Scheme: scheme, Mapper: mapper(), Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		return nil, fmt.Errorf("mcs: client: %w", err)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("mcs: metrics: %w", err)
	}
	s := &Services{
		cfg: cfg, self: cfg.Identity.ClusterID(), log: cfg.Logger.With("component", "mcs"), cache: ca, c: c,
		inbound: make(chan []byte, 256), wake: make(chan struct{}, 1), connect: make(chan string, 64),
		members:   map[string]member{},
		inbox:     NewInbox(),
		snapshots: map[string]Snapshot{},
		foreign:   map[key]bool{},
		metrics:   m,
	}
	s.importer, err = ctrl.New(ctrl.Config[key]{
		Name: "mcs_imports", Workers: 2, Metrics: cfg.Metrics, Reconcile: s.reconcileImport,
		// client-go's default, as before the loops moved to ctrl.
		RateLimiter: workqueue.DefaultTypedControllerRateLimiter[key](),
		Errors: &ctrl.ErrorLog[key]{
			Logger: s.log, Failed: "import not reconciled; retrying",
			Attrs: ctrl.Named[key]("import"), Level: conflictQuiet,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mcs: %w", err)
	}
	s.exportStatuses, err = ctrl.New(ctrl.Config[key]{
		Name: "mcs_exports", Metrics: cfg.Metrics, Reconcile: ctrl.WithoutDelay(s.exportStatus),
		RateLimiter: workqueue.DefaultTypedControllerRateLimiter[key](),
		Errors: &ctrl.ErrorLog[key]{
			Logger: s.log, Failed: "ServiceExport status not written; retrying",
			Attrs: ctrl.Named[key]("export"), Level: conflictQuiet,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mcs: %w", err)
	}
	s.imports, s.exports = s.importer.Queue(), s.exportStatuses.Queue()
	return s, nil
}

// conflictQuiet is the level of a reconcile's error: a conflict is a
// cache behind its own write, no news.
func conflictQuiet(err error) slog.Level {
	if apierrors.IsConflict(err) {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// Scheme holds the kinds Services reads and writes, and only their
// groups (core, discovery, mcs): every group of client-go's would be
// registered in each scheme made, for nothing.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := errors.Join(corev1.AddToScheme(s), discoveryv1.AddToScheme(s), mcsv1alpha1.AddToScheme(s)); err != nil {
		panic(err) // static registrations: a conflict is a bug
	}
	return s
}

// mapper is static: the MCS CRDs may be established after the agent
// starts, and a static mapper needs no discovery.
func mapper() meta.RESTMapper {
	mcsGV := schema.GroupVersion{Group: mcsv1alpha1.GroupName, Version: "v1alpha1"}
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion, mcsGV})
	m.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	m.Add(corev1.SchemeGroupVersion.WithKind("Service"), meta.RESTScopeNamespace)
	m.Add(discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), meta.RESTScopeNamespace)
	m.Add(mcsGV.WithKind("ServiceExport"), meta.RESTScopeNamespace)
	m.Add(mcsGV.WithKind("ServiceImport"), meta.RESTScopeNamespace)
	return m
}

// Receive takes a message from the gossip (discovery's OnServices). It
// never blocks: when the backlog is full the message is dropped, and the
// sender's next resend brings it again.
func (s *Services) Receive(msg []byte) {
	select {
	case s.inbound <- msg:
	default:
		s.metrics.rejected.WithLabelValues("backlog").Inc()
	}
}

// PeerChanged takes the engine's state of a peer: its identity key, which
// verifies its exports, and whether it is Connected, which decides who
// gets this cluster's exports and whose exports are held here.
func (s *Services) PeerChanged(st peering.PeerState) {
	s.mu.Lock()
	old, known := s.members[st.ClusterID]
	m := member{key: st.IdentityKey, connected: st.Phase == peering.PhaseConnected, goneSince: old.goneSince}
	if len(m.key) == 0 {
		m.key = old.key
	}
	switch {
	case m.connected:
		m.goneSince = time.Time{}
	case !known || old.connected:
		m.goneSince = s.cfg.Now()
	}
	s.members[st.ClusterID] = m
	s.mu.Unlock()
	if m.connected && (!known || !old.connected) {
		select {
		case s.connect <- st.ClusterID:
		default: // the next resync reaches it
		}
	}
}

// keyOf returns a member's identity key.
func (s *Services) keyOf(cluster string) (ed25519.PublicKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.members[cluster]
	return m.key, ok && len(m.key) == ed25519.PublicKeySize
}

// connectedPeers are the peers this cluster's exports go to.
func (s *Services) connectedPeers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id, m := range s.members {
		if m.connected {
			out = append(out, id)
		}
	}
	return out
}

// Run watches and reconciles until ctx ends; it returns once every
// goroutine it started has.
func (s *Services) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	s.mu.Lock()
	s.started = s.cfg.Now()
	s.mu.Unlock()
	if err := s.watch(ctx); err != nil {
		return err
	}
	errc, synced, err := ctrl.StartCache(ctx, &wg, s.cache, "mcs")
	if !synced {
		return err
	}
	if err := s.enqueueExistingImports(ctx); err != nil {
		return err
	}
	// Both stop with ctx, which ends when the cache does.
	wg.Go(func() { _ = s.importer.Run(ctx, nil) })
	wg.Go(func() { _ = s.exportStatuses.Run(ctx, nil) })
	wg.Go(func() { s.receiveLoop(ctx) })
	wg.Go(func() { s.exportLoop(ctx) })
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("mcs: watch: %w", err)
		}
		return nil
	}
}

// receiveLoop verifies and applies the peers' snapshots.
func (s *Services) receiveLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-s.inbound:
			s.receive(msg)
		}
	}
}

func (s *Services) receive(msg []byte) {
	p, err := DecodePage(msg, s.keyOf)
	if err == nil && p.Cluster == s.self {
		err = fmt.Errorf("exports claiming to be this cluster's: %w", ErrMalformed)
	}
	if err != nil {
		s.reject(err)
		return
	}
	s.mu.Lock()
	snap, ok, err := s.inbox.Add(p)
	s.mu.Unlock()
	if err != nil {
		s.reject(err)
		return
	}
	if ok {
		s.metrics.received.Inc()
		s.apply(snap)
	}
}

// reject counts a refused message; a repeat of the snapshot applied (a
// resend) is no news and is only counted.
func (s *Services) reject(err error) {
	reason := "malformed"
	switch {
	case errors.Is(err, ErrReplay):
		s.metrics.rejected.WithLabelValues("replay").Inc()
		return
	case errors.Is(err, ErrUnknown):
		reason = "unknown_sender"
	case errors.Is(err, identity.ErrBadSignature):
		reason = "bad_signature"
	}
	s.metrics.rejected.WithLabelValues(reason).Inc()
	s.log.Warn("exports refused", "reason", reason, "err", err)
}

// apply holds snap as its cluster's exports and queues every import it
// changes.
func (s *Services) apply(snap Snapshot) {
	s.mu.Lock()
	old := s.snapshots[snap.Cluster]
	s.snapshots[snap.Cluster] = snap
	s.mu.Unlock()
	s.log.Debug("exports of a peer applied", "peer", snap.Cluster, "serial", snap.Serial, "exports", len(snap.Exports))
	s.enqueueChanged(snap.Cluster, old.Exports, snap.Exports)
}

// withdraw drops the exports of a cluster gone for longer than Grace.
func (s *Services) withdraw(cluster string) {
	s.mu.Lock()
	old, ok := s.snapshots[cluster]
	delete(s.snapshots, cluster)
	s.inbox.Forget(cluster)
	s.mu.Unlock()
	if ok {
		s.log.Info("exports of a peer withdrawn", "peer", cluster, "exports", len(old.Exports))
		s.enqueueChanged(cluster, old.Exports, nil)
	}
}

// expired are the clusters whose exports are held and that have been
// other than Connected for longer than Grace.
func (s *Services) expired(now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for c := range s.snapshots {
		if c == s.self {
			continue
		}
		m := s.members[c]
		if !m.connected && (m.goneSince.IsZero() || now.Sub(m.goneSince) > s.cfg.Grace) {
			out = append(out, c)
		}
	}
	return out
}

// nextSerial issues a serial above every one issued before, kept before
// it is used, near the clock (readable in logs).
func (s *Services) nextSerial() (uint64, error) {
	const serialKey = "mcs-export-serial"
	b, err := s.cfg.Serials.LoadOrCreateKey(serialKey, func() ([]byte, error) { return make([]byte, 8), nil })
	if err != nil || len(b) != 8 {
		return 0, fmt.Errorf("read the last export serial: %v (%d bytes)", err, len(b))
	}
	n := max(binary.BigEndian.Uint64(b)+1, uint64(s.cfg.Now().UnixNano()))
	if err := s.cfg.Serials.PutKey(serialKey, binary.BigEndian.AppendUint64(nil, n)); err != nil {
		return 0, fmt.Errorf("store the export serial: %w", err)
	}
	return n, nil
}

type metrics struct {
	sent, received prometheus.Counter
	rejected       *prometheus.CounterVec
	untranslatable prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "flotilla_mcs_snapshots_sent_total",
			Help: "Snapshots of this cluster's exports sent to a peer (every page counted once)."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "flotilla_mcs_snapshots_applied_total",
			Help: "Snapshots of a peer's exports received complete, verified and applied."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flotilla_mcs_messages_refused_total",
			Help: "Export messages not applied, by reason: replay (a resend of what is applied, or older), unknown_sender, bad_signature, malformed, backlog."},
			[]string{"reason"}),
		untranslatable: prometheus.NewCounter(prometheus.CounterOpts{Name: "flotilla_mcs_endpoints_untranslatable_total",
			Help: "Imported endpoint addresses left out because no view of their cluster covers them."}),
	}
	return m, ctrl.Register(reg, m.sent, m.received, m.rejected, m.untranslatable)
}
