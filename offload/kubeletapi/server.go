package kubeletapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/apiauth"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// DefaultPort is where the virtual nodes serve the kubelet API
// when Config.Port is 0: the gateway node's own kubelet holds
// 10250 on the same address.
const DefaultPort = 10260

// Config is what a Server needs.
type Config struct {
	// Client reaches the local API server: pods, NamespaceOffloads and
	// virtual nodes (read), the client CA ConfigMap (watched),
	// SubjectAccessReviews (created).
	Client kubeclient.Interface
	// Credentials hands out what each provider granted; the requests go
	// there with it.
	Credentials remote.Credentials
	// Address is where the local API server reaches the agent: the
	// InternalIP every virtual node registers. The serving certificate
	// names it.
	Address netip.Addr
	// Port is where to listen on Address, and what the virtual nodes
	// register as their kubelet port; 0 is DefaultPort.
	Port uint16
	// AgentNamespace holds the CA Secret (CASecret).
	AgentNamespace string
	// CALifetime, ServingLifetime and CAPublishDelay replace the
	// defaults (DefaultCALifetime...; the publish delay: until
	// the old CA can no longer cover a serving certificate) when set;
	// tests shorten them to see a rotation.
	CALifetime, ServingLifetime, CAPublishDelay time.Duration
	// AuthorizedTTL and UnauthorizedTTL are how long the answer of a
	// SubjectAccessReview is used again (DefaultAuthorizedTTL and
	// DefaultUnauthorizedTTL when 0).
	AuthorizedTTL, UnauthorizedTTL time.Duration

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Server is the kubelet API of the virtual nodes, so that `kubectl
// logs`, `exec`, `attach` and `port-forward` work on offloaded pods: the
// local API server calls it as it would a node's kubelet, and it forwards
// each call to the pod's subresource on the provider's API server, with
// the credential the provider granted. It authenticates and authorizes
// like a kubelet: a client certificate of the cluster's client CA, and
// nodes/proxy on the pod's node by SubjectAccessReview.
type Server struct {
	cfg      Config
	log      *slog.Logger
	m        *kubeletAPIMetrics
	certs    *certs.CAStore
	clientCA *certs.ClientCA
	authz    *apiauth.Cache[proxyQuestion, proxyAnswer]
	// providers reach the providers' API servers, one client each.
	providers *providerClients
	server    *certs.Server
	// renewFailing says the last renewal failed, so that its error is
	// logged once (owned by the server's goroutine).
	renewFailing bool

	nodes corelisters.NodeLister // the virtual nodes, once Run has them
	// namesChanged wakes Run when the set of virtual nodes changed: the
	// serving certificate names them.
	namesChanged chan struct{}

	// streams are the requests being served, upgraded ones included,
	// which http.Server does not wait for.
	mu      sync.Mutex
	closing bool
	streams sync.WaitGroup
}

// NewServer checks cfg and prepares a Server; Run serves, with
// certificates of its own CAs, kept in a Secret.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Client == nil || cfg.Credentials == nil {
		return nil, errors.New("kubelet API: the local client and the credentials are required")
	}
	cfg.Address = cfg.Address.Unmap()
	if !cfg.Address.IsValid() || cfg.Address.IsUnspecified() {
		return nil, fmt.Errorf("kubelet API: address %v: want the address the API server reaches the agent at (the virtual nodes' InternalIP), which the serving certificate names", cfg.Address)
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.AgentNamespace == "" {
		return nil, errors.New("kubelet API: the agent's namespace is required (it holds the CA Secret)")
	}
	if cfg.AuthorizedTTL <= 0 {
		cfg.AuthorizedTTL = DefaultAuthorizedTTL
	}
	if cfg.UnauthorizedTTL <= 0 {
		cfg.UnauthorizedTTL = DefaultUnauthorizedTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := Lifetimes(cfg)
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("kubelet API: %w", err)
	}
	log := cfg.Logger.With("component", "kubelet-api")
	k := &Server{
		cfg: cfg, log: log,
		certs: certs.NewCAStore(certs.CAStoreConfig{
			Kube: cfg.Client, Namespace: cfg.AgentNamespace, Secret: CASecret,
			Name: "flotilla virtual nodes", Component: "kubelet_api", Lifetimes: l, Log: log,
		}),
		clientCA:     &certs.ClientCA{Name: "kubelet API", Log: log},
		providers:    newProviderClients(cfg.Credentials),
		namesChanged: make(chan struct{}, 1),
	}
	var err error
	if k.m, err = newKubeletAPIMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("kubelet API: metrics: %w", err)
	}
	k.server = &certs.Server{
		Name: "kubelet API", Addr: k.Addr().String(), Store: k.certs,
		Start: k.loadCertificates, Renew: k.renewCertificates, Changed: k.namesChanged,
		Listening: func() { log.Info("kubelet API serving the virtual nodes", "address", k.Addr().String()) },
	}
	k.authz = apiauth.NewCache[proxyQuestion, proxyAnswer](apiauth.CacheConfig{
		TTL: cfg.AuthorizedTTL, RefusedTTL: cfg.UnauthorizedTTL, Size: authCacheSize,
		Hits: k.m.authCache.WithLabelValues("hit"), Misses: k.m.authCache.WithLabelValues("miss"),
	})
	if err := ctrl.Register(cfg.Metrics, k.certs); err != nil {
		return nil, fmt.Errorf("kubelet API: metrics: %w", err)
	}
	return k, nil
}

// CA is the bundle of the CAs of the serving certificates (PEM), once
// Run has them: what an API server that verifies its kubelets
// (--kubelet-certificate-authority) must trust for the virtual nodes. It
// is the ca.crt of Secret CASecret as well.
func (k *Server) CA() []byte { return k.certs.Bundle() }

// Ready says whether the kubelet API serves with a valid certificate,
// for the agent's /readyz.
func (k *Server) Ready() error { return k.server.Ready() }

// Addr is where the kubelet API listens.
func (k *Server) Addr() netip.AddrPort { return netip.AddrPortFrom(k.cfg.Address, k.cfg.Port) }

// Run watches the client CA and the virtual nodes, serves until ctx ends,
// renewing the serving certificate on the way, and returns once every
// request it served has ended.
func (k *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	configMaps := kubeclient.NewInformer(&corev1.ConfigMap{}, k.cfg.Client.CoreV1().ConfigMaps(certs.ClusterClientCANamespace), kubeclient.ByName(certs.ClusterClientCAConfigMap))
	nodes := kubeclient.NewInformer(&corev1.Node{}, k.cfg.Client.CoreV1().Nodes(), func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{offload.LabelVirtualNode: "true"}).String()
	})
	if err := nodes.SetTransform(nodeNameAndLabels); err != nil {
		return fmt.Errorf("kubelet API: watch the virtual nodes: %w", err)
	}
	var informers sync.WaitGroup
	defer func() {
		cancel()
		informers.Wait()
	}()
	// A deleted ConfigMap leaves the CA held: the API server puts it back.
	takeCA := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			k.clientCA.SetFrom(cm)
		}
	}
	if _, err := configMaps.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: takeCA, UpdateFunc: func(_, obj any) { takeCA(obj) },
	}); err != nil {
		return fmt.Errorf("kubelet API: watch the client CA: %w", err)
	}
	changed := func(any) {
		select {
		case k.namesChanged <- struct{}{}:
		default:
		}
	}
	// A virtual node gone is its provider gone: its client goes too.
	gone := func(obj any) {
		changed(obj)
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if n, ok := obj.(*corev1.Node); ok {
			if provider, ok := strings.CutPrefix(n.Name, offload.VirtualNodePrefix); ok {
				k.providers.drop(provider)
			}
		}
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, obj any) { changed(obj) }, DeleteFunc: gone,
	}); err != nil {
		return fmt.Errorf("kubelet API: watch the virtual nodes: %w", err)
	}
	k.mu.Lock()
	k.nodes = corelisters.NewNodeLister(nodes.GetIndexer())
	k.mu.Unlock()
	informers.Go(func() { configMaps.RunWithContext(ctx) })
	informers.Go(func() { nodes.RunWithContext(ctx) })
	if !k.waitSynced(ctx, configMaps.HasSynced, nodes.HasSynced) {
		return nil
	}

	srv := &http.Server{
		Handler: k.handler(),
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Verified against the client CA held at the time of the
			// request (it changes), so that a stranger gets a 401 rather
			// than a failed handshake, as from a kubelet.
			ClientAuth: tls.RequestClientCert,
			// HTTP/1.1 only: exec, attach and port-forward switch
			// protocols, which HTTP/2 cannot.
			NextProtos: []string{"http/1.1"},
		},
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(k.log.Handler(), slog.LevelDebug),
	}
	// Once the server is closed: upgraded streams end with their
	// request's context.
	k.server.Closed = func() {
		k.mu.Lock()
		k.closing = true
		k.mu.Unlock()
		cancel()
		k.streams.Wait()
	}
	return k.server.Serve(ctx, srv)
}

// loadCertificates reads the CAs from their Secret and issues the first
// serving certificate (certs.Server's Start).
func (k *Server) loadCertificates(ctx context.Context) error {
	err := k.certs.Load(ctx)
	if err == nil {
		// A CA in the Secret is published: operators copy it from there.
		k.certs.NoteTrusted(k.certs.Bundle())
		k.certs.SetHosts(kubeletHosts(k))
		_, err = k.certs.Sync(ctx, time.Now())
	}
	if err != nil {
		k.log.Warn("kubelet API: no serving certificate yet; retrying", "err", err)
		return err
	}
	k.certs.NotePublished(time.Now())
	return nil
}

// renewCertificates rotates the CAs and renews the serving certificate
// for the virtual nodes of now (certs.Server's Renew), logging a failure
// once.
func (k *Server) renewCertificates(ctx context.Context, now time.Time) error {
	k.certs.SetHosts(kubeletHosts(k))
	rotated, err := k.certs.Sync(ctx, now)
	if rotated {
		k.log.Info("kubelet API: new CA bundle in Secret "+k.cfg.AgentNamespace+"/"+CASecret+"; an API server that verifies kubelets must trust it before it signs", "cas", k.certs.Summary())
	}
	switch {
	case err != nil && !k.renewFailing:
		k.log.Warn("kubelet API: serving certificate not renewed; retrying", "err", err)
		k.renewFailing = true
	case err == nil && k.renewFailing:
		k.log.Info("kubelet API: serving certificate renewed again")
		k.renewFailing = false
	}
	if err != nil {
		return err
	}
	// The Secret is where the bundle is published.
	k.certs.NotePublished(now)
	return nil
}

// waitSynced waits for the informers, saying once if they take long: the
// agent may lack the rights to read the client CA.
func (k *Server) waitSynced(ctx context.Context, synced ...toolscache.InformerSynced) bool {
	start := time.Now()
	warned := false
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, s := range synced {
			if !s() {
				if !warned && time.Since(start) > 30*time.Second {
					warned = true
					k.log.Warn("kubelet API: still waiting to read the client CA and the virtual nodes; the agent needs get, list and watch on ConfigMap kube-system/extension-apiserver-authentication (Role extension-apiserver-authentication-reader) and on nodes")
				}
				return false, nil
			}
		}
		return true, nil
	})
	return err == nil
}

// nodeNameAndLabels keeps of a Node what the kubelet API reads.
func nodeNameAndLabels(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, ResourceVersion: n.ResourceVersion}}, nil
}

// virtualNodeNames are the names of the virtual nodes of this cluster.
func (k *Server) virtualNodeNames() []string {
	list, err := k.nodeLister().List(labels.Everything())
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(list))
	for _, n := range list {
		names = append(names, n.Name)
	}
	return names
}

func (k *Server) nodeLister() corelisters.NodeLister {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.nodes
}

// providerOf is the provider a virtual node stands for; false when node
// is not one of this cluster's virtual nodes.
func (k *Server) providerOf(node string) (string, bool) {
	provider, ok := strings.CutPrefix(node, offload.VirtualNodePrefix)
	if !ok || identity.ValidateClusterID(provider) != nil {
		return "", false
	}
	n, err := k.nodeLister().Get(node)
	if err != nil || n.Labels[offload.LabelVirtualNode] != "true" {
		return "", false
	}
	return provider, true
}

// begin counts a request being served; false once Run is stopping.
func (k *Server) begin() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closing {
		return false
	}
	k.streams.Add(1)
	return true
}

// Results of requests, the label of flotilla_kubelet_api_requests_total.
const (
	kubeletResultOK              = "ok"
	kubeletResultUnauthenticated = "unauthenticated"
	kubeletResultForbidden       = "forbidden"
	kubeletResultNotFound        = "not_found"
	kubeletResultNoCredential    = "no_credential"
	kubeletResultRefused         = "provider_refused"
	kubeletResultUnreachable     = "provider_unreachable"
	kubeletResultError           = "error"
)

type kubeletAPIMetrics struct {
	requests *prometheus.CounterVec
	// authCache counts the authorizations answered from the cache (hit)
	// and by a SubjectAccessReview (miss).
	authCache *prometheus.CounterVec
}

func newKubeletAPIMetrics(reg prometheus.Registerer) (*kubeletAPIMetrics, error) {
	m := &kubeletAPIMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_kubelet_api_requests_total",
			Help: "Requests to the virtual nodes' kubelet API, by route (containerLogs, exec, attach, portForward, other) and result.",
		}, []string{"route", "result"}),
		authCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_kubelet_api_authorization_cache_total",
			Help: "Authorizations of the kubelet API's callers answered from the cache (result=hit) or by a SubjectAccessReview to the local API server (result=miss).",
		}, []string{"result"}),
	}
	return m, ctrl.Register(reg, m.requests, m.authCache)
}
