package kubeletapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
)

// kubeletRoute is a route of the kubelet API and the pod subresource of
// the provider's API server it is forwarded to.
type kubeletRoute struct {
	name        string // the kubelet's first path segment; the metrics label
	subresource string
	// params turns the kubelet's query into the API server's; what it
	// does not name is dropped.
	params func(in url.Values, container string) url.Values
}

var (
	routeLogs        = kubeletRoute{"containerLogs", "log", logParams}
	routeExec        = kubeletRoute{"exec", "exec", execParams}
	routeAttach      = kubeletRoute{"attach", "attach", attachParams}
	routePortForward = kubeletRoute{"portForward", "portforward", portForwardParams}
)

// routeName is the route label of a request's path.
func routeName(path string) string {
	first, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	for _, r := range []kubeletRoute{routeLogs, routeExec, routeAttach, routePortForward} {
		if first == r.name {
			return r.name
		}
	}
	return "other"
}

func logParams(in url.Values, container string) url.Values {
	out := url.Values{"container": {container}}
	copyParams(out, in, "follow", "previous", "timestamps", "sinceSeconds", "sinceTime", "tailLines", "limitBytes")
	// Only a stream that narrows (Stdout, Stderr): All is the default,
	// and a provider without PodLogsQuerySplitStreams refuses the
	// parameter.
	if s := in.Get("stream"); s != "" && s != "All" {
		out.Set("stream", s)
	}
	return out
}

func execParams(in url.Values, container string) url.Values {
	out := attachParams(in, container)
	copyParams(out, in, "command")
	return out
}

// attachParams: the kubelet's input, output and error (as the API server
// calls its kubelets) are the API's stdin, stdout and stderr.
func attachParams(in url.Values, container string) url.Values {
	out := url.Values{"container": {container}}
	for _, name := range [][2]string{{"input", "stdin"}, {"output", "stdout"}, {"error", "stderr"}, {"tty", "tty"}} {
		if v, ok := in[name[0]]; ok {
			out[name[1]] = v
		}
	}
	return out
}

// portForwardParams: the kubelet's port (comma-separated, as the API
// server joins them) is the API's ports, one value each.
func portForwardParams(in url.Values, _ string) url.Values {
	out := url.Values{}
	for _, v := range in["port"] {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out.Add("ports", p)
			}
		}
	}
	return out
}

func copyParams(out, in url.Values, keys ...string) {
	for _, k := range keys {
		if v, ok := in[k]; ok {
			out[k] = v
		}
	}
}

// forwardedHeaders are the only request headers passed on to the
// provider: what the streaming protocols negotiate with. Above all no
// Authorization (client-go's bearer token would then not be set) and no
// Impersonate-*: the provider sees the consumer's credential and nothing
// of the caller's.
var forwardedHeaders = []string{
	"Accept", "Connection", "Upgrade", "User-Agent", "X-Stream-Protocol-Version",
	"Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Protocol", "Sec-Websocket-Extensions",
}

type userKey struct{}

// handler authenticates every request, then routes it; anything but the
// four routes is not found.
func (k *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /containerLogs/{namespace}/{pod}/{container}", k.forwarder(routeLogs))
	// SPDY upgrades are POSTs, WebSocket ones GETs.
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		mux.Handle(method+" /exec/{namespace}/{pod}/{container}", k.forwarder(routeExec))
		mux.Handle(method+" /attach/{namespace}/{pod}/{container}", k.forwarder(routeAttach))
		mux.Handle(method+" /portForward/{namespace}/{pod}", k.forwarder(routePortForward))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		k.m.requests.WithLabelValues(routeName(r.URL.Path), kubeletResultNotFound).Inc()
		http.NotFound(w, r)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := authenticate(k.clientCA, r)
		if err != nil {
			k.log.Debug("kubelet API: unauthenticated request refused", "route", routeName(r.URL.Path), "err", err)
			k.m.requests.WithLabelValues(routeName(r.URL.Path), kubeletResultUnauthenticated).Inc()
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	})
}

// podRequest is what a request names.
type podRequest struct {
	namespace, pod, container string
}

func (p podRequest) String() string { return p.namespace + "/" + p.pod }

// kubeletRefusal is a request answered here, with the status and what to tell.
type kubeletRefusal struct {
	status  int
	result  string
	message string
}

func (k *Server) forwarder(rt kubeletRoute) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !k.begin() {
			http.Error(w, "the kubelet API is stopping", http.StatusServiceUnavailable)
			return
		}
		defer k.streams.Done()
		u, _ := r.Context().Value(userKey{}).(kubeletUser)
		req := podRequest{namespace: r.PathValue("namespace"), pod: r.PathValue("pod"), container: r.PathValue("container")}
		var result string
		// Counted however the request ends: ReverseProxy ends a stream cut
		// midway (kubectl logs -f stopped, the provider gone) by panicking
		// with http.ErrAbortHandler, which net/http expects back.
		defer func() {
			p := recover()
			if p != nil && result == kubeletResultOK && r.Context().Err() == nil {
				result = kubeletResultUnreachable // the provider's side ended it
			}
			k.m.requests.WithLabelValues(rt.name, result).Inc()
			k.log.Debug("kubelet API request", "route", rt.name, "pod", req.String(), "container", req.container,
				"user", u.name, "result", result)
			if p != nil {
				panic(p)
			}
		}()
		target, pc, ref := k.resolve(r, u, rt, req)
		if ref != nil {
			result = ref.result
			http.Error(w, ref.message, ref.status)
			return
		}
		k.proxy(w, r, pc, target, &result)
	})
}

// resolve finds where req goes, or why it goes nowhere: the local pod,
// the caller's right to its node's kubelet API, the virtual node and its
// provider, the mirrored namespace, the credential and the remote pod.
func (k *Server) resolve(r *http.Request, u kubeletUser, rt kubeletRoute, req podRequest) (*url.URL, *providerClient, *kubeletRefusal) {
	ctx := r.Context()
	pod, err := k.cfg.Client.CoreV1().Pods(req.namespace).Get(ctx, req.pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return nil, nil, &kubeletRefusal{http.StatusInternalServerError, kubeletResultError, fmt.Sprintf("read pod %s: %v", req, err)}
	}
	// Authorized before anything is told of the pod. A pod that is not
	// there is asked about as on every node.
	node := ""
	if pod != nil {
		node = pod.Spec.NodeName
	}
	allowed, reason, err := k.authorize(ctx, u, r.Method, node)
	if err != nil {
		return nil, nil, &kubeletRefusal{http.StatusInternalServerError, kubeletResultError, fmt.Sprintf("authorize %s: %v", u.name, err)}
	}
	if !allowed {
		k.log.Debug("kubelet API: request forbidden", "user", u.name, "node", node, "reason", reason)
		return nil, nil, &kubeletRefusal{http.StatusForbidden, kubeletResultForbidden,
			fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource=proxy)", u.name, verbOf(r.Method))}
	}
	if pod == nil {
		return nil, nil, &kubeletRefusal{http.StatusNotFound, kubeletResultNotFound, fmt.Sprintf("pod %s not found", req)}
	}
	provider, ok := k.providerOf(node)
	if !ok {
		return nil, nil, &kubeletRefusal{http.StatusNotFound, kubeletResultNotFound,
			fmt.Sprintf("pod %s is on node %q, not on a virtual node: its own kubelet serves it", req, node)}
	}
	remoteNS, err := k.remoteNamespace(ctx, req.namespace, provider)
	if err != nil {
		return nil, nil, &kubeletRefusal{http.StatusNotFound, kubeletResultNotFound, fmt.Sprintf("pod %s: %v", req, err)}
	}
	cfg, g, err := k.cfg.Credentials.Credential(provider)
	if err != nil {
		k.providers.drop(provider)
		return nil, nil, &kubeletRefusal{http.StatusServiceUnavailable, kubeletResultNoCredential, fmt.Sprintf("pod %s: %v", req, err)}
	}
	pc, err := k.providers.of(provider, cfg, g)
	if err != nil {
		return nil, nil, &kubeletRefusal{http.StatusInternalServerError, kubeletResultError, err.Error()}
	}
	if ref := checkRemotePod(ctx, pc.pods, provider, remoteNS, pod); ref != nil {
		return nil, nil, ref
	}
	target, err := url.Parse(cfg.Host)
	if err != nil || target.Host == "" {
		return nil, nil, &kubeletRefusal{http.StatusInternalServerError, kubeletResultError, fmt.Sprintf("the API server of %s: %q is not a URL", provider, cfg.Host)}
	}
	if target.Scheme == "" {
		target.Scheme = "https"
	}
	// A host without a path joins to a path without its leading slash,
	// which goes on the wire as is.
	if !strings.HasPrefix(target.Path, "/") {
		target.Path = "/" + target.Path
	}
	target = target.JoinPath("api", "v1", "namespaces", remoteNS, "pods", req.pod, rt.subresource)
	target.RawQuery = rt.params(r.URL.Query(), req.container).Encode()
	return target, pc, nil
}

// remoteNamespace is the namespace ns has on provider, from its
// NamespaceOffload, while it is Ready there.
func (k *Server) remoteNamespace(ctx context.Context, ns, provider string) (string, error) {
	// One read of one kind per request: a raw read, not a second client.
	raw, err := k.cfg.Client.CoreV1().RESTClient().Get().
		AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "namespaces", ns, "namespaceoffloads").
		DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("read the NamespaceOffloads of namespace %s: %w", ns, err)
	}
	var list v1alpha1.NamespaceOffloadList
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("read the NamespaceOffloads of namespace %s: %w", ns, err)
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.NamespaceOffload) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	for i := range list.Items {
		if name, ready := offload.MirroredNamespace(&list.Items[i], provider); ready {
			return name, nil
		}
	}
	return "", fmt.Errorf("namespace %s is not offloaded to %s, or not Ready there yet", ns, provider)
}

// checkRemotePod makes sure the provider's pod of the same name stands
// for pod (its origin annotation), not for an earlier pod of that name
// still being replaced there.
func checkRemotePod(ctx context.Context, cs kubeclient.Interface, provider, remoteNS string, pod *corev1.Pod) *kubeletRefusal {
	remote, err := cs.CoreV1().Pods(remoteNS).Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return &kubeletRefusal{http.StatusNotFound, kubeletResultNotFound,
			fmt.Sprintf("pod %s/%s has no pod on %s yet (namespace %s)", pod.Namespace, pod.Name, provider, remoteNS)}
	case err != nil:
		return &kubeletRefusal{http.StatusBadGateway, kubeletResultUnreachable, fmt.Sprintf("read pod %s/%s on %s: %v", remoteNS, pod.Name, provider, err)}
	}
	want := pod.Namespace + "/" + pod.Name + "/" + string(pod.UID)
	if got := remote.Annotations[offload.AnnotationOrigin]; got != want {
		return &kubeletRefusal{http.StatusNotFound, kubeletResultNotFound,
			fmt.Sprintf("pod %s/%s on %s stands for %q, not for this pod (%s): it is being replaced", remoteNS, pod.Name, provider, got, want)}
	}
	return nil
}

// proxy forwards r to target with the provider's client pc, switching
// protocols when the provider does (101), and streaming as it goes; it
// sets *result as it learns how the request went.
func (k *Server) proxy(w http.ResponseWriter, r *http.Request, pc *providerClient, target *url.URL, result *string) {
	*result = kubeletResultOK
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = target
			pr.Out.Host = ""
			for h := range pr.Out.Header {
				if !slices.Contains(forwardedHeaders, h) {
					delete(pr.Out.Header, h)
				}
			}
		},
		Transport:     pc.rt,
		FlushInterval: -1, // logs --follow: every line as it comes
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode >= 400 {
				*result = kubeletResultRefused
				k.log.Debug("kubelet API: the provider refused", "url", target.Redacted(), "status", resp.StatusCode)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			*result = kubeletResultUnreachable
			if r.Context().Err() == nil {
				k.log.Warn("kubelet API: forwarding failed", "url", target.Redacted(), "err", err)
			}
			http.Error(w, fmt.Sprintf("forward to %s: %v", target.Host, err), http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(k.log.Handler(), slog.LevelDebug),
	}
	p.ServeHTTP(w, r)
}

// providerTransport reaches a provider's API server with cfg's credential
// over HTTP/1.1 only. client-go's own transport (rest.TransportFor)
// negotiates HTTP/2 with the server, where a request cannot switch
// protocols: exec, attach and port-forward (SPDY) would fail. Its
// wrappers (bearer token, user agent) are kept: they return the response
// untouched, so a 101's body is still the connection ReverseProxy needs.
func providerTransport(cfg *rest.Config) (*http.Transport, http.RoundTripper, error) {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, nil, err
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tlsCfg.NextProtos = []string{"http/1.1"}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	base := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if cfg.Proxy != nil {
		base.Proxy = cfg.Proxy
	}
	if cfg.Dial != nil {
		base.DialContext = cfg.Dial
	}
	rt, err := rest.HTTPWrappersForConfig(cfg, base)
	if err != nil {
		return nil, nil, err
	}
	return base, rt, nil
}
