// Package apiauth guards an HTTP endpoint the way a kubelet or
// controller-runtime's metrics filters do: the caller's bearer token is
// authenticated by a TokenReview and the request authorized by a
// SubjectAccessReview of its path (a non-resource URL, the verb from the
// method) against the local API server. Answers are cached for a short
// while (Cache, which the kubelet API's authorization shares) and guarded
// requests are rate-limited. A Guard trusts no address: the loopback of
// a host-network server is every host-network process's and pod's on the
// node; it lets the loopback through only when told to (TrustLoopback).
package apiauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/internal/sourcerate"
)

// Defaults of a Guard.
const (
	// DefaultTTL is how long an answer (who a token is, whether it may)
	// is used again; a refusal is kept for DefaultRefusedTTL, shorter, so
	// that a permission just granted works soon.
	DefaultTTL        = time.Minute
	DefaultRefusedTTL = 10 * time.Second
	// DefaultRate and DefaultBurst bound the guarded requests a second
	// of one source address: a scrape every few seconds and an
	// operator's page pass; a flood is answered 429 before it costs a
	// review, and does not hold back another source. All sources
	// together get ten times as much.
	DefaultRate  = 20
	DefaultBurst = 40
	// sources bounds the source addresses whose limiters are kept.
	sources = 1024
	// cacheSize bounds the answers kept: few callers read metrics, and
	// one that cycles tokens must not grow the cache.
	cacheSize = 256
)

// Config is what a Guard needs.
type Config struct {
	// Client reaches the local API server with the rights to create
	// tokenreviews and subjectaccessreviews.
	Client kubeclient.Interface
	// Audiences the token must be for; empty: the API server's own.
	Audiences []string
	// TrustLoopback lets requests from a loopback address through
	// without a token.
	TrustLoopback bool
	// TTL and RefusedTTL: DefaultTTL and DefaultRefusedTTL when zero.
	TTL, RefusedTTL time.Duration
	// Rate and Burst, per source address: DefaultRate and DefaultBurst
	// when zero.
	Rate  rate.Limit
	Burst int
	Log   *slog.Logger
	Now   func() time.Time
}

// Guard wraps handlers with authentication and authorization.
type Guard struct {
	cfg Config
	// all bounds every source together; perSource each one.
	all       *rate.Limiter
	perSource *sourcerate.Limiter
	answers   *Cache[answerKey, answer]

	mu sync.Mutex
	// lastErr is the last review failure logged, so that one repeated is
	// logged once.
	lastErr string
}

// answerKey is one question: a token (by its hash: the token itself is
// never kept) and the verb and path asked for.
type answerKey struct {
	token      [sha256.Size]byte
	verb, path string
}

type answer struct {
	status  int    // 0: allowed
	message string // why not
}

// New returns a Guard.
func New(cfg Config) (*Guard, error) {
	if cfg.Client == nil {
		return nil, errors.New("apiauth: a Kubernetes client is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.RefusedTTL == 0 {
		cfg.RefusedTTL = DefaultRefusedTTL
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Guard{cfg: cfg, all: rate.NewLimiter(10*cfg.Rate, 10*cfg.Burst), perSource: sourcerate.New(float64(cfg.Rate), cfg.Burst, sources),
		answers: NewCache[answerKey, answer](CacheConfig{TTL: cfg.TTL, RefusedTTL: cfg.RefusedTTL, Size: cacheSize, Now: cfg.Now})}, nil
}

// Wrap lets a request through to h when it comes from the loopback
// address (TrustLoopback), or its bearer token authenticates and may use the verb of its
// method on its path (nonResourceURLs in RBAC); otherwise it answers 401
// (no token, or one the API server does not know), 403 (not allowed),
// 429 (too many requests) or 503 (the API server could not answer).
func (g *Guard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.cfg.TrustLoopback && loopback(r.RemoteAddr) {
			h.ServeHTTP(w, r)
			return
		}
		if !g.allow(r.RemoteAddr) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="flotilla"`)
			http.Error(w, "Unauthorized: send a bearer token (a ServiceAccount's) that may get this path", http.StatusUnauthorized)
			return
		}
		status, msg := g.decide(r.Context(), token, verbOf(r.Method), r.URL.Path)
		if status != 0 {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="flotilla"`)
			}
			http.Error(w, msg, status)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// allow takes a request of remote from its source's bucket and from all
// sources'.
func (g *Guard) allow(remote string) bool {
	var src netip.Addr
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		src = ap.Addr().Unmap()
	}
	return g.perSource.Allow(src) && g.all.Allow()
}

// decide answers from the cache while fresh, else asks the API server.
func (g *Guard) decide(ctx context.Context, token, verb, path string) (int, string) {
	key := answerKey{token: sha256.Sum256([]byte(token)), verb: verb, path: path}
	a, err := g.answers.Get(ctx, key, func(ctx context.Context) (answer, bool, error) {
		status, msg, err := g.review(ctx, token, verb, path)
		return answer{status: status, message: msg}, status == 0, err
	})
	if err != nil {
		g.logOnce(err)
		return http.StatusServiceUnavailable, "the API server could not review the request; try again"
	}
	return a.status, a.message
}

// review asks who token is (TokenReview), then whether they may (a
// SubjectAccessReview of the non-resource URL path).
func (g *Guard) review(ctx context.Context, token, verb, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr, err := g.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: g.cfg.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return 0, "", fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, "Unauthorized: the token is not valid", nil
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := g.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return 0, "", fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if !sar.Status.Allowed {
		return http.StatusForbidden, fmt.Sprintf("Forbidden: %s may not %s %s: bind it to a ClusterRole with nonResourceURLs %q, verb %q "+
			"(flotilla-metrics-reader has /metrics, flotilla-viewer every path)", u.Username, verb, path, path, verb), nil
	}
	return 0, "", nil
}

func (g *Guard) logOnce(err error) {
	g.mu.Lock()
	repeated := g.lastErr == err.Error()
	g.lastErr = err.Error()
	g.mu.Unlock()
	if !repeated {
		g.cfg.Log.Warn("a request to a guarded endpoint could not be reviewed; answering 503", "err", err)
	}
}

// bearer is the request's bearer token.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// loopback says whether a request's remote address is a loopback one.
func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// verbOf maps an HTTP method to the verb RBAC knows it by.
func verbOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "post"
	case http.MethodPut:
		return "put"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(method)
}

// Addresses are where a server of port that must serve health only on the
// loopback and the pod's address listens: host given, that host alone;
// none, the loopback and podIP (the node's address, in the host network),
// or only the loopback without a pod address.
func Addresses(addr string, podIP netip.Addr) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	if host != "" {
		return []string{addr}, nil
	}
	out := []string{net.JoinHostPort("127.0.0.1", port)}
	if podIP.IsValid() && !podIP.IsLoopback() {
		out = append(out, net.JoinHostPort(podIP.String(), port))
	}
	return slices.Clip(out), nil
}

// IdleTimeout is how long a server of a metrics port keeps a connection
// with no request under way open. A client that opens a connection per
// scrape and never closes it would otherwise hold a goroutine and 8 KiB
// of buffers in the agent per scrape, for as long as it runs; a scraper
// that comes back sooner keeps its connection.
const IdleTimeout = 15 * time.Second

// NewServer is the HTTP server of a metrics port serving h: a request's
// header read within 5 s, an idle connection closed after IdleTimeout.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: IdleTimeout}
}
