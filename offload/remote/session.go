package remote

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// Session is this cluster's one connection to a provider, which
// namespace mirroring, pod offloading and reflection share: one
// transport to the provider's API server, the clients over it, for
// writes (with the credential's timeout) and for watches (without), and
// the token of the credential held at each request. A renewed token
// keeps the session and its watches; a credential that reaches another
// server, CA or tenant namespace makes a new session (Sessions.Of).
type Session struct {
	provider string
	server   string // the grant's
	host     string // the REST config's
	tenant   string
	ca       []byte

	write, watch *rest.Config // watch: no timeout, or the watches are cut
	client       client.Client
	watchClient  client.WithWatch
	core         typedcorev1.CoreV1Interface
	watchCore    typedcorev1.CoreV1Interface
	watchHTTP    *http.Client
}

// newSession opens a session with provider for the credential c;
// creds hands out the token at each request.
func newSession(provider string, c ProviderCredential, creds Credentials) (*Session, error) {
	s := &Session{
		provider: provider, server: c.Grant.Server, host: c.Config.Host, tenant: c.Grant.Namespace,
		ca:    bytes.Clone(c.Config.CAData),
		write: ProviderConfig(provider, creds, c.Config),
	}
	s.watch = rest.CopyConfig(s.write)
	s.watch.Timeout = 0
	rt, err := rest.TransportFor(s.write)
	if err != nil {
		return nil, fmt.Errorf("transport to %s at %s: %w", provider, c.Grant.Server, err)
	}
	writeHTTP := &http.Client{Transport: rt, Timeout: s.write.Timeout}
	s.watchHTTP = &http.Client{Transport: rt}
	opts := client.Options{Scheme: sessionScheme, Mapper: sessionMapper, HTTPClient: writeHTTP}
	if s.client, err = client.New(s.write, opts); err != nil {
		return nil, fmt.Errorf("client for %s at %s: %w", provider, c.Grant.Server, err)
	}
	opts.HTTPClient = s.watchHTTP
	if s.watchClient, err = client.NewWithWatch(s.watch, opts); err != nil {
		return nil, fmt.Errorf("client for %s at %s: %w", provider, c.Grant.Server, err)
	}
	if s.core, err = typedcorev1.NewForConfigAndClient(s.write, writeHTTP); err != nil {
		return nil, fmt.Errorf("client for %s at %s: %w", provider, c.Grant.Server, err)
	}
	if s.watchCore, err = typedcorev1.NewForConfigAndClient(s.watch, s.watchHTTP); err != nil {
		return nil, fmt.Errorf("client for %s at %s: %w", provider, c.Grant.Server, err)
	}
	return s, nil
}

// reaches reports whether c reaches what the session was opened
// against: the same server, CA and tenant namespace (its token may be
// another).
func (s *Session) reaches(c ProviderCredential) bool {
	return c.Grant.Server == s.server && c.Config.Host == s.host && c.Grant.Namespace == s.tenant && bytes.Equal(c.Config.CAData, s.ca)
}

// Provider is the provider's cluster ID.
func (s *Session) Provider() string { return s.provider }

// Server is the provider's API server, as its grant names it.
func (s *Session) Server() string { return s.server }

// TenantNamespace is this cluster's tenant namespace on the provider.
func (s *Session) TenantNamespace() string { return s.tenant }

// Client writes and reads the session's kinds (SessionScheme) on the
// provider.
func (s *Session) Client() client.Client { return s.client }

// WatchClient lists and watches the session's kinds on the provider.
func (s *Session) WatchClient() client.WithWatch { return s.watchClient }

// CoreV1 writes and reads the core kinds on the provider; WatchCoreV1
// lists and watches them.
func (s *Session) CoreV1() typedcorev1.CoreV1Interface      { return s.core }
func (s *Session) WatchCoreV1() typedcorev1.CoreV1Interface { return s.watchCore }

// NewCache is a cache of the session's kinds on the provider, over the
// session's transport; opts says which namespaces and objects.
func (s *Session) NewCache(opts cache.Options) (cache.Cache, error) {
	opts.Scheme, opts.Mapper, opts.HTTPClient = sessionScheme, sessionMapper, s.watchHTTP
	return cache.New(s.watch, opts)
}

// Sessions keeps the one session with each provider whose credential
// this cluster holds.
type Sessions struct {
	creds Credentials

	mu   sync.Mutex
	held map[string]*Session
}

// NewSessions keeps the sessions with the providers creds hands out
// credentials for.
func NewSessions(creds Credentials) *Sessions {
	return &Sessions{creds: creds, held: map[string]*Session{}}
}

// Of is the session with provider for the credential held for it now:
// the one opened before while the credential reaches the same endpoint,
// a new one when it reaches another. An error when no credential is
// held (Credentials says why); the session before is then forgotten.
func (ss *Sessions) Of(provider string) (*Session, error) {
	cfg, g, err := ss.creds.Credential(provider)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err != nil {
		delete(ss.held, provider)
		return nil, noCredential{err}
	}
	c := ProviderCredential{Config: cfg, Grant: g}
	if s := ss.held[provider]; s != nil && s.reaches(c) {
		return s, nil
	}
	s, err := newSession(provider, c, ss.creds)
	if err != nil {
		return nil, err
	}
	ss.held[provider] = s
	return s, nil
}

// ErrNoCredential is what Sessions.Of says, with the reason, when no
// usable credential is held for a provider: not a failure of the
// session.
var ErrNoCredential = errors.New("no usable credential")

// noCredential is a reason of ErrNoCredential, read as itself.
type noCredential struct{ err error }

func (e noCredential) Error() string        { return e.err.Error() }
func (e noCredential) Unwrap() error        { return e.err }
func (e noCredential) Is(target error) bool { return target == ErrNoCredential }

// The kinds a session reads and writes on a provider: the namespace
// requests (mirroring), pods (pod offloading), the ConfigMaps, Secrets,
// Services and EndpointSlices reflected. A static mapper: the
// consumer's rights there do not reach discovery of every group.
var (
	sessionScheme = newSessionScheme()
	sessionMapper = newSessionMapper()
)

func newSessionScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := errors.Join(v1alpha1.AddToScheme(s), corev1.AddToScheme(s), discoveryv1.AddToScheme(s)); err != nil {
		panic(err) // static registrations: a conflict shows in every test
	}
	return s
}

func newSessionMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion})
	// The lists too: a cache asks the mapper whether a list's kind is
	// namespaced.
	for _, gvk := range []schema.GroupVersionKind{
		v1alpha1.GroupVersion.WithKind("NamespaceRequest"),
		corev1.SchemeGroupVersion.WithKind("Pod"), corev1.SchemeGroupVersion.WithKind("ConfigMap"),
		corev1.SchemeGroupVersion.WithKind("Secret"), corev1.SchemeGroupVersion.WithKind("Service"),
		discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
	} {
		m.Add(gvk, meta.RESTScopeNamespace)
		m.Add(gvk.GroupVersion().WithKind(gvk.Kind+"List"), meta.RESTScopeNamespace)
	}
	return m
}
