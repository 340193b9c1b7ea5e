package kubeletapi

import (
	"fmt"
	"net/http"
	"sync"

	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// providerClient reaches one provider's API server over one HTTP/1.1
// transport: a clientset for the remote pod's read and the forwarded
// requests, made for one credential (its serial and server) and kept
// while it lasts, so that requests reuse their connections. Each request
// carries the token held at that moment.
type providerClient struct {
	serial uint64
	server string
	pods   kubeclient.Interface
	base   *http.Transport
	rt     http.RoundTripper
}

// providerClients are the kubelet API's clients, one per provider.
type providerClients struct {
	creds remote.Credentials

	mu   sync.Mutex
	held map[string]*providerClient
}

func newProviderClients(creds remote.Credentials) *providerClients {
	return &providerClients{creds: creds, held: map[string]*providerClient{}}
}

// of is provider's client for the credential cfg and g held for it now:
// the one made before, or a new one when the credential's serial or
// server changed.
func (p *providerClients) of(provider string, cfg *rest.Config, g grant.Grant) (*providerClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.held[provider]
	if old != nil && old.serial == g.Serial && old.server == cfg.Host {
		return old, nil
	}
	// The token of the credential held at each request, as the
	// provider's other clients have it.
	pcfg := remote.ProviderConfig(provider, p.creds, cfg)
	base, rt, err := providerTransport(pcfg)
	if err != nil {
		return nil, fmt.Errorf("transport to %s: %w", provider, err)
	}
	pods, err := kubeclient.NewForConfigAndClient(pcfg, &http.Client{Transport: rt, Timeout: pcfg.Timeout})
	if err != nil {
		base.CloseIdleConnections()
		return nil, fmt.Errorf("client for %s: %w", provider, err)
	}
	if old != nil {
		// Requests under way keep their connections.
		old.base.CloseIdleConnections()
	}
	c := &providerClient{serial: g.Serial, server: cfg.Host, pods: pods, base: base, rt: rt}
	p.held[provider] = c
	return c, nil
}

// drop forgets provider's client: it has no credential held, or no
// virtual node, any more.
func (p *providerClients) drop(provider string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.held[provider]; ok {
		c.base.CloseIdleConnections()
		delete(p.held, provider)
	}
}
