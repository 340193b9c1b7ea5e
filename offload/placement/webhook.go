package placement

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
)

// DefaultClientNames are the common names of the client certificates an
// API server presents that the agent accepts by default: one issued for
// webhooks (docs/offload.md), or kubeadm's apiserver-kubelet-client,
// which an AdmissionConfiguration may give webhooks too.
var DefaultClientNames = []string{"kube-apiserver-webhook-client", "kube-apiserver-kubelet-client"}

// WebhookConfig is what a Webhook needs.
type WebhookConfig struct {
	// Config reaches the local API server.
	Config *rest.Config
	// Address is where the API server reaches the agent (the gateway
	// node's address: the agent runs in the host network); the webhook
	// listens there, on Port (DefaultPort when 0), and its
	// serving certificate names it.
	Address netip.Addr
	Port    uint16
	// URL, when set, is what the API server calls instead of
	// https://Address:Port/placement (a name or address in front of the
	// agent); the certificate names its host too.
	URL string
	// AgentNamespace holds the CA Secret; it is never sent to the
	// webhook.
	AgentNamespace string
	// CALifetime, ServingLifetime and CAPublishDelay replace the
	// defaults (DefaultWebhookCALifetime...) when set; tests shorten
	// them to see a rotation.
	CALifetime, ServingLifetime, CAPublishDelay time.Duration
	// Shared, when set, is where NamespaceOffloads are read from (the
	// agent's SharedCache) instead of an informer of the webhook's own.
	Shared *offload.SharedCache
	// The webhook answers only clients presenting a certificate for
	// client authentication (the API server, configured with an
	// AdmissionConfiguration to present one) that chains to ClientCA, a
	// PEM bundle, or when ClientCA is empty to the cluster's client CA
	// (kube-system/extension-apiserver-authentication, watched).
	// AnyClient answers clients without one instead: for an API server
	// that cannot be given a certificate (a managed control plane).
	ClientCA  []byte
	AnyClient bool
	// ClientNames are the common names of the client certificates
	// accepted; empty accepts any the CA signed.
	ClientNames []string

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Webhook is the mutating admission webhook that places the
// pods of offloaded namespaces (placement.go): it serves HTTPS with a
// certificate of its own CA and keeps the MutatingWebhookConfiguration,
// the CA Secret and the certificates current.
type Webhook struct {
	cfg      WebhookConfig
	log      *slog.Logger
	url      string
	hosts    []string // what the serving certificate names
	kube     kubeclient.Interface
	meta     metadata.Interface
	cache    cache.Cache
	requests *prometheus.CounterVec
	// limited counts requests refused before placement: too large, too
	// many at once, without an accepted client certificate.
	limited *prometheus.CounterVec
	// slots bounds the reviews read and answered at once.
	slots   chan struct{}
	clients *certs.ClientCA // nil: no client certificate required
	// watchCA: clients is the cluster's client CA, read from its
	// ConfigMap.
	watchCA   bool
	refusedMu sync.Mutex
	refusedAt map[string]time.Time // by reason: the last refusal logged
	certs     *certs.CAStore
	changed   chan struct{} // the configuration changed on the API server
	server    *certs.Server

	// Owned by the server's goroutine (its Start and Renew).
	applied []byte // the caBundle last applied
	owner   types.UID
	lastErr string
}

// Results of an admission, the values of flotilla_webhook_requests_total's
// label.
const (
	resultMutated  = "mutated"
	resultAdmitted = "admitted" // unchanged
	resultRefused  = "refused"
	resultError    = "error"
)

// NewWebhook checks cfg and prepares a Webhook; Run
// serves it.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	if cfg.Config == nil {
		return nil, errors.New("placement webhook: the local REST config is required")
	}
	if !cfg.Address.IsValid() || cfg.Address.IsUnspecified() {
		return nil, fmt.Errorf("placement webhook: the agent's address %q is not one the API server can call (set it to the gateway node's address)", cfg.Address)
	}
	if cfg.AgentNamespace == "" {
		return nil, errors.New("placement webhook: the agent's namespace is required (it holds the CA Secret)")
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := certs.CertLifetimes{CA: certs.DefaultWebhookCALifetime, Serving: certs.DefaultWebhookServingLifetime, Publish: certs.DefaultWebhookCAPublishDelay}
	if cfg.CALifetime > 0 {
		l.CA = cfg.CALifetime
	}
	if cfg.ServingLifetime > 0 {
		l.Serving = cfg.ServingLifetime
	}
	if cfg.CAPublishDelay > 0 {
		l.Publish = cfg.CAPublishDelay
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("placement webhook: %w", err)
	}
	w := &Webhook{
		cfg: cfg, log: cfg.Logger.With("component", "placement-webhook"),
		url:     "https://" + netip.AddrPortFrom(cfg.Address, cfg.Port).String() + placementPath,
		hosts:   []string{cfg.Address.String()},
		changed: make(chan struct{}, 1),
	}
	w.slots, w.refusedAt = make(chan struct{}, maxConcurrentReviews), map[string]time.Time{}
	switch {
	case cfg.AnyClient && (len(cfg.ClientCA) > 0 || len(cfg.ClientNames) > 0):
		return nil, errors.New("placement webhook: a client CA or client names, yet any client answered: choose one")
	case cfg.AnyClient:
	case len(cfg.ClientCA) > 0:
		var err error
		if w.clients, err = certs.NewClientCA("placement webhook", cfg.ClientCA); err != nil {
			return nil, err
		}
	default:
		w.clients, w.watchCA = &certs.ClientCA{Name: "placement webhook", Log: w.log}, true
	}
	if cfg.URL != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("placement webhook: URL %q: want https://host[:port]/path, without user, query or fragment", cfg.URL)
		}
		w.url = cfg.URL
		if u.Hostname() != cfg.Address.String() {
			w.hosts = append(w.hosts, u.Hostname())
		}
	}
	var err error
	if w.kube, err = kubeclient.NewForConfig(cfg.Config); err != nil {
		return nil, fmt.Errorf("placement webhook: client: %w", err)
	}
	w.certs = certs.NewCAStore(certs.CAStoreConfig{
		Kube: w.kube, Namespace: cfg.AgentNamespace, Secret: CASecret,
		Name: "flotilla placement webhook", Component: "placement_webhook", Lifetimes: l, Log: w.log,
	})
	w.server = &certs.Server{
		Name: "placement webhook", Addr: netip.AddrPortFrom(cfg.Address, cfg.Port).String(), Store: w.certs,
		Start: w.start, Renew: w.renew, Changed: w.changed, Grace: 5 * time.Second,
		Listening: func() { w.log.Info("placement webhook serving", "url", w.url, "listen", w.server.Addr) },
	}
	if w.meta, err = metadata.NewForConfig(cfg.Config); err != nil {
		return nil, fmt.Errorf("placement webhook: client: %w", err)
	}
	scheme, mapper := offload.MirrorScheme(), webhookMapper()
	// The cluster's client CA is a ConfigMap.
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("placement webhook: %w", err)
	}
	w.cache, err = cache.New(cfg.Config, cache.Options{
		Scheme: scheme, Mapper: mapper, DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			offload.MetadataOf(nodeGVK):          {Transform: nameAndLabelsOnly},
			offload.MetadataOf(peerGVK):          {Transform: nameAndLabelsOnly},
			offload.MetadataOf(webhookConfigGVK): {Field: fields.OneTermEqualSelector("metadata.name", ConfigurationName)},
			&corev1.ConfigMap{}: {
				Namespaces: map[string]cache.Config{certs.ClusterClientCANamespace: {}},
				Field:      fields.OneTermEqualSelector("metadata.name", certs.ClusterClientCAConfigMap),
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("placement webhook: cache: %w", err)
	}
	w.cache = offload.WithShared(w.cache, cfg.Shared, offload.SharedNamespaceOffloads)
	w.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flotilla_webhook_requests_total",
		Help: "Pod admissions the placement webhook answered, by result: mutated, admitted (unchanged), refused, error.",
	}, []string{"result"})
	for _, r := range []string{resultMutated, resultAdmitted, resultRefused, resultError} {
		w.requests.WithLabelValues(r)
	}
	w.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flotilla_webhook_requests_limited_total",
		Help: "Requests the placement webhook refused before reading a review, by reason: too_large, unknown_length, busy, no_client_certificate, client_not_allowed.",
	}, []string{"reason"})
	for _, r := range []string{limitTooLarge, limitUnknownLength, limitBusy, limitNoClientCert, limitClientNotAllowed} {
		w.limited.WithLabelValues(r)
	}
	if err := ctrl.Register(cfg.Metrics, w.requests, w.limited, w.certs); err != nil {
		return nil, fmt.Errorf("placement webhook: metrics: %w", err)
	}
	return w, nil
}

var (
	nodeGVK          = corev1.SchemeGroupVersion.WithKind("Node")
	peerGVK          = v1alpha1.GroupVersion.WithKind("Peer")
	webhookConfigGVK = admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration")
)

func metadataListOf(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadataList {
	m := &metav1.PartialObjectMetadataList{}
	m.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return m
}

// webhookMapper is offload.MirrorMapper with the other kinds the webhook
// reads.
func webhookMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, admissionregistrationv1.SchemeGroupVersion})
	m.Add(peerGVK, meta.RESTScopeRoot)
	m.Add(v1alpha1.GroupVersion.WithKind("NamespaceOffload"), meta.RESTScopeNamespace)
	m.Add(nodeGVK, meta.RESTScopeRoot)
	m.Add(webhookConfigGVK, meta.RESTScopeRoot)
	m.Add(corev1.SchemeGroupVersion.WithKind("ConfigMap"), meta.RESTScopeNamespace)
	return m
}

// nameAndLabelsOnly keeps what placement reads of a Node or a Peer: a
// cluster's Nodes carry large annotations it has no use for.
func nameAndLabelsOnly(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Labels: m.Labels, UID: m.UID, ResourceVersion: m.ResourceVersion, DeletionTimestamp: m.DeletionTimestamp,
	}}, nil
}

// Run serves the webhook and keeps its objects current until ctx ends;
// it returns once every goroutine it started has. The configuration
// stays when it returns: an agent restarting (an upgrade) must not let
// pods through unplaced meanwhile; DeleteConfiguration removes it.
func (w *Webhook) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for _, obj := range []client.Object{&v1alpha1.NamespaceOffload{}, offload.MetadataOf(nodeGVK), offload.MetadataOf(peerGVK)} {
		if _, err := w.cache.GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("placement webhook: watch %T: %w", obj, err)
		}
	}
	configs, err := w.cache.GetInformer(ctx, offload.MetadataOf(webhookConfigGVK))
	if err != nil {
		return fmt.Errorf("placement webhook: watch MutatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	poke := func(any) {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
	if _, err := configs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	}); err != nil {
		return fmt.Errorf("placement webhook: watch MutatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	if w.watchCA {
		if err := w.watchClientCA(ctx); err != nil {
			return err
		}
	}
	cacheErr, synced, err := ctrl.StartCache(ctx, &wg, w.cache, "placement webhook")
	if !synced {
		return err
	}

	// Certificates first, then the server, then the configuration
	// (Renew): the API server calls the webhook as soon as it reads a
	// configuration.
	mux := http.NewServeMux()
	mux.Handle(placementPath, w)
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if w.clients != nil {
		// Verified by ServeHTTP, against the CA as it is then, and
		// counted there when refused.
		tlsConfig.ClientAuth = tls.RequestClientCert
	}
	srv := newHTTPServer(mux, tlsConfig, w.log)
	served := make(chan error, 1)
	wg.Go(func() { served <- w.server.Serve(ctx, srv) })
	select {
	case <-ctx.Done():
		return nil
	case err := <-cacheErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("placement webhook: watch: %w", err)
		}
		return nil
	case err := <-served:
		return err
	}
}

// watchClientCA keeps the cluster's client CA current: a CA added there
// is trusted at once, one removed no longer. A ConfigMap deleted leaves
// the CA held: the API server puts it back.
func (w *Webhook) watchClientCA(ctx context.Context) error {
	inf, err := w.cache.GetInformer(ctx, &corev1.ConfigMap{})
	if err != nil {
		return fmt.Errorf("placement webhook: watch the client CA, ConfigMap %s/%s: %w", certs.ClusterClientCANamespace, certs.ClusterClientCAConfigMap, err)
	}
	take := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == certs.ClusterClientCANamespace && cm.Name == certs.ClusterClientCAConfigMap {
			w.clients.SetFrom(cm)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: take, UpdateFunc: func(_, o any) { take(o) },
	}); err != nil {
		return fmt.Errorf("placement webhook: watch the client CA: %w", err)
	}
	return nil
}

// start loads the CAs and issues the first serving certificate
// (certs.Server's Start).
func (w *Webhook) start(ctx context.Context) error {
	err := w.load(ctx)
	if err == nil {
		_, err = w.certs.Sync(ctx, time.Now())
	}
	w.noteError(err)
	return err
}

// renew keeps the certificates and the configuration current
// (certs.Server's Renew).
func (w *Webhook) renew(ctx context.Context, now time.Time) error {
	err := w.sync(ctx, now)
	w.noteError(err)
	return err
}

// load reads the CAs from their Secret (a restarted agent keeps serving
// what the API server trusts) and notes which of them the configuration
// already carries.
func (w *Webhook) load(ctx context.Context) error {
	if err := w.certs.Load(ctx); err != nil {
		return err
	}
	w.certs.SetHosts(w.hosts)
	cfg, err := w.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigurationName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("placement webhook: read MutatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	for _, wh := range cfg.Webhooks {
		w.certs.NoteTrusted(wh.ClientConfig.CABundle)
	}
	return nil
}

// sync brings the CAs, the serving certificate and the configuration in
// line with now.
func (w *Webhook) sync(ctx context.Context, now time.Time) error {
	if _, err := w.certs.Sync(ctx, now); err != nil {
		return err
	}
	return w.syncConfig(ctx, now)
}

// syncConfig applies the configuration when its caBundle or owner
// changed, or when the API server's copy did (someone edited or deleted
// it): server-side apply puts back what is ours.
func (w *Webhook) syncConfig(ctx context.Context, now time.Time) error {
	owner, err := offloadCRDUID(ctx, w.meta)
	if err != nil {
		return fmt.Errorf("placement webhook: %w", err)
	}
	if owner == "" {
		// No CRD, so no NamespaceOffload and nothing to place. Applied
		// now, the configuration would lose its owner and outlive
		// `kubectl delete -k deploy/`, which deletes the CRD while the
		// agent still runs.
		return nil
	}
	bundle := w.certs.Bundle()
	if err := ApplyConfiguration(ctx, w.kube, Configuration(w.url, bundle, w.cfg.AgentNamespace, owner)); err != nil {
		return fmt.Errorf("placement webhook: %w", err)
	}
	if !bytes.Equal(bundle, w.applied) || owner != w.owner {
		w.log.Info("placement webhook configuration applied", "name", ConfigurationName, "url", w.url, "cas", w.certs.Summary(), "crdOwner", owner != "")
	}
	w.applied, w.owner = bundle, owner
	// A new CA may sign once in the caBundle long enough: WakeAt says
	// when.
	w.certs.NotePublished(now)
	return nil
}

// Ready says whether the webhook serves with a valid certificate, for
// the agent's /readyz.
func (w *Webhook) Ready() error { return w.server.Ready() }

// noteError logs an error of sync once per change.
func (w *Webhook) noteError(err error) {
	switch {
	case err == nil && w.lastErr != "":
		w.lastErr = ""
		w.log.Info("placement webhook objects current again")
	case err != nil && err.Error() != w.lastErr:
		w.lastErr = err.Error()
		w.log.Warn("placement webhook objects not current; retrying", "err", err)
	}
}

// receiveBuffer is what HTTP/2 buffers of request bodies not yet read,
// per connection and per stream: the least it allows. Its default (1 MiB
// each) let 50 connections whose reviews wait for a slot hold 50 MiB of
// unread bodies; over HTTP/1.1 they wait in the kernel's socket buffers.
const receiveBuffer = 64 << 10

// newHTTPServer is the webhook's HTTP server around handler.
func newHTTPServer(handler http.Handler, tlsConfig *tls.Config, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		// A review is read and answered in well under a second; a
		// client that trickles its body loses its slot.
		ReadTimeout:    30 * time.Second,
		MaxHeaderBytes: 64 << 10,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerConnection: receiveBuffer,
			MaxReceiveBufferPerStream:     receiveBuffer,
		},
		// Handshakes that fail (a scanner, an API server with an old
		// bundle) are not the agent's errors.
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		TLSConfig: tlsConfig,
	}
}
