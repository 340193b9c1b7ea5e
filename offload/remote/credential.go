package remote

import (
	"net/http"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/flotilla-io/flotilla/offload/grant"
	"k8s.io/client-go/rest"
)

// Credentials hands out what providers granted this cluster
// (*Consumer): the REST config of the provider's API server with the
// credential, and the grant (its Namespace is the tenant namespace there).
type Credentials interface {
	Credential(provider string) (*rest.Config, grant.Grant, error)
}

// ProviderCredential is what this cluster holds for one provider.
type ProviderCredential struct {
	Config *rest.Config
	Grant  grant.Grant
}

// ProviderConfig is base for writes to provider: no client-side rate
// limit (its priority and fairness limits its tenants; a thousand pods
// are a thousand creates), and the token of the credential held at each
// request, so a renewed token needs no new watch. A watch needs its
// Timeout cleared. base's own wrappers, if any, run inside.
func ProviderConfig(id string, creds Credentials, base *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = -1, -1
	cfg.BearerToken, cfg.BearerTokenFile = "", ""
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &currentToken{provider: id, creds: creds, next: rt}
	})
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return cfg
}

// currentToken authenticates each request with the token of the
// credential held for provider at that moment.
type currentToken struct {
	provider string
	creds    Credentials
	next     http.RoundTripper
}

func (t *currentToken) RoundTrip(req *http.Request) (*http.Response, error) {
	cfg, _, err := t.creds.Credential(t.provider)
	if err != nil {
		return nil, err
	}
	req = utilnet.CloneRequest(req)
	req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
	return t.next.RoundTrip(req)
}

func (t *currentToken) WrappedRoundTripper() http.RoundTripper { return t.next }
