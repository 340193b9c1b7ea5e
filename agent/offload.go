package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/kubeletapi"
	"github.com/flotilla-io/flotilla/offload/mirror"
	"github.com/flotilla-io/flotilla/offload/placement"
	"github.com/flotilla-io/flotilla/offload/podsync"
	"github.com/flotilla-io/flotilla/offload/reflection"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/offload/vnode"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
)

// offloading is the agent's part in grants, both ways: as a provider, the
// tenants and credentials of the peers it grants; as a consumer, the
// credentials peers granted it. It is made after the gossip join; the
// engine's states and grants reach it through an offloadRelay.
type offloading struct {
	objects *peerapi.Objects
	// grants are what this cluster grants its consumers; credentials
	// what its providers granted it.
	fences      *tenancy.Fences
	grants      *tenancy.Grants
	credentials *remote.Consumer
	// offloads extends this cluster's namespaces to its providers;
	// requests answers the namespace requests of the consumers it grants.
	offloads *mirror.Consumer
	requests *mirror.Provider
	// nodes are the virtual nodes that stand for the providers; kubelet
	// serves their kubelet API; placement applies a NamespaceOffload's
	// pod strategy at admission.
	nodes     *vnode.Nodes
	kubelet   *kubeletapi.Server
	placement *placement.Webhook
	// pods runs the pods bound to virtual nodes on their providers.
	pods *podsync.Reflector
	// services is the Multi-Cluster Services API (agent/services.go).
	services
	// reflection copies what offloaded pods need (ConfigMaps, Secrets,
	// Services, EndpointSlices) into the namespaces mirrored for them.
	reflection *reflection.Reflector

	// shared holds one informer per kind of this cluster that several
	// components read (NamespaceOffloads, Namespaces, Services,
	// EndpointSlices, ServiceExports) and reads Peers from the Peer
	// writer's: the components' PeerCache.
	shared *offload.SharedCache

	// hostedEndpoints translates what consumers reflect of their
	// endpoints on third clusters into this cluster's views of those
	// clusters (docs/services.md, "Endpoints on third clusters").
	hostedEndpoints *reflection.HostedEndpoints
}

func (a *Agent) newOffloading(st state, objects *peerapi.Objects, eng *atomic.Pointer[peering.Engine]) (*offloading, error) {
	// It writes Peers' status and nothing else, so it is told where they
	// are served: without a mapper it discovers every API group the
	// server has, and kept what it found (0.5 MB of the agent's heap).
	peersOnly := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion})
	peersOnly.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	c, err := client.New(a.restCfg, client.Options{Scheme: peerapi.Scheme(), Mapper: peersOnly})
	if err != nil {
		return nil, fmt.Errorf("client for Peers: %w", err)
	}
	dnsService, _ := fenceDNSService(a.cfg.FenceDNSService) // checked in New
	tenants, err := tenancy.NewTenants(tenancy.TenantsConfig{
		Config: a.restCfg, Client: a.kube, Audience: a.cfg.GrantAudience, Lifetime: a.cfg.GrantLifetime,
		Logger: a.log, Metrics: a.registry,
		// As read at the start, as the ledger holds them: each namespace
		// made for a consumer needs them, and they change only with a
		// restart.
		PodNetworks: func(context.Context) ([]netip.Prefix, error) { return a.podNetworks, nil },
		DNSService:  dnsService, DNSAddresses: a.cfg.FenceDNSAddresses,
	})
	if err != nil {
		return nil, err
	}
	// The provider grants nothing until the admission policies that
	// confine it and its consumers are proven in force (docs/security.md).
	bindings, err := deploy.AdmissionBindings()
	if err != nil {
		return nil, err
	}
	var grants *tenancy.Grants // told of the fences changing, once made
	fences, err := tenancy.NewFences(tenancy.FencesConfig{
		Client: a.kube, Bindings: bindings,
		Changed: func(error) {
			if grants != nil {
				grants.FencesChanged()
			}
		},
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	var requests *mirror.Provider // told of grants changing, once made
	grants, err = tenancy.NewGrants(tenancy.GrantsConfig{
		Identity: st.id, Peers: objects.Reader(), Client: c, Tenants: tenants,
		APIServer: a.apiServer(), Sender: engineGrants{eng}, Serials: st.ledger,
		Policy: a.cfg.OffloadGrants, Grace: a.cfg.OffloadRevokeAfter, Fences: fences,
		Changed: func(consumer string) {
			if requests != nil {
				requests.GrantChanged(consumer)
			}
		},
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	credentials, err := remote.NewConsumer(remote.ConsumerConfig{
		Store: grant.NewStore(st.id, st.ledger), Peers: objects.Reader(), Client: c,
		Policy: a.cfg.OffloadTo, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	// One cache of Peers for every component that reads them, the Peer
	// writer's (started and synced before they run): each with a cache
	// of its own kept a copy of every Peer (docs/offload.md, "The
	// agent's memory").
	peers, err := offload.NewSharedCache(a.restCfg, objects.Shared())
	if err != nil {
		return nil, err
	}
	// One session with each provider, shared by the namespaces', the
	// pods' and the objects' reflection: one transport, one client.
	sessions := remote.NewSessions(credentials)
	offloads, err := mirror.NewConsumer(mirror.ConsumerConfig{
		Config: a.restCfg, Credentials: credentials, Sessions: sessions, Self: st.id.ClusterID(), Peers: peers,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	requests, err = mirror.NewProvider(mirror.ProviderConfig{
		Config: a.restCfg, Tenants: tenants, Grants: grants, AgentNamespace: a.agentNamespace(), Shared: peers,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	nodes, err := vnode.NewNodes(vnode.Config{
		Config: a.restCfg, Client: a.kube, Credentials: credentials,
		Address: a.cfg.NodeAddress, KubeletPort: int32(a.cfg.KubeletPort), Peers: peers,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	kubelet, err := kubeletapi.NewServer(kubeletapi.Config{
		Client: a.kube, Credentials: credentials, Address: a.cfg.NodeAddress, Port: uint16(a.cfg.KubeletPort),
		AgentNamespace: a.agentNamespace(), Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	var clientCA []byte
	anyClient, clientNames := false, a.cfg.WebhookClientNames
	switch a.cfg.WebhookClientCA {
	case "", WebhookClientCluster:
	case WebhookClientAny:
		anyClient, clientNames = true, nil
		a.log.Warn("placement webhook answers any client (--webhook-client-ca=none): whoever reaches its port may send it reviews")
	default:
		if clientCA, err = os.ReadFile(a.cfg.WebhookClientCA); err != nil {
			return nil, fmt.Errorf("placement webhook: read --webhook-client-ca: %w", err)
		}
	}
	placement, err := placement.NewWebhook(placement.WebhookConfig{
		Config: a.restCfg, Address: a.cfg.NodeAddress, Port: uint16(a.cfg.WebhookPort), AgentNamespace: a.agentNamespace(),
		ClientCA: clientCA, AnyClient: anyClient, ClientNames: clientNames,
		Shared: peers, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	// The API server calls these two: the agent is not ready while either
	// does not serve with a valid certificate.
	a.ready.add("placement webhook", placement.Ready)
	a.ready.add("kubelet API", kubelet.Ready)
	pods, err := podsync.NewReflector(podsync.Config{
		Config: a.restCfg, Self: st.id.ClusterID(), Credentials: credentials, Sessions: sessions, Views: ledgerViews{st.ledger},
		Address: a.cfg.NodeAddress, Peers: peers, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	// Reflection (docs/services.md).
	reflector, err := reflection.NewReflector(reflection.ReflectorConfig{
		Config: a.restCfg, Self: st.id.ClusterID(), Credentials: credentials, Sessions: sessions, Views: ledgerViews{st.ledger},
		Peers: peers, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	// Endpoints on third clusters, the provider's side (docs/services.md):
	// the ledger's views of this cluster's peers translate them.
	hostedEndpoints, err := reflection.NewHostedEndpoints(reflection.HostedEndpointsConfig{
		Config: a.restCfg, Self: st.id.ClusterID(), Views: ledgerViews{st.ledger},
		Peers: peers, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, err
	}
	a.ready.add("fences", grants.Ready)
	return &offloading{objects: objects, fences: fences, grants: grants, credentials: credentials, offloads: offloads, requests: requests,
		nodes: nodes, kubelet: kubelet, placement: placement, pods: pods, reflection: reflector,
		hostedEndpoints: hostedEndpoints, shared: peers}, nil
}

// peerChanged hands a peer's state to grants and the Multi-Cluster Services
// (offloadRelay).
func (o *offloading) peerChanged(s peering.PeerState) {
	o.grants.PeerChanged(s)
	o.services.peerChanged(s)
}

// GrantReceived hands a provider's grant to the consumer's credentials
// (offloadRelay).
func (o *offloading) GrantReceived(from string, key ed25519.PublicKey, sealed []byte) {
	o.credentials.GrantReceived(from, key, sealed)
}

// start runs both sides once the Peer informer has synced.
func (o *offloading) start(ctx context.Context, comps *components) error {
	if err := o.objects.AddHandler(ctx, o.grants.PeerHandler()); err != nil {
		return err
	}
	if err := o.objects.AddHandler(ctx, o.credentials.PeerHandler()); err != nil {
		return err
	}
	// The shared informers, made as the components below first ask for
	// a kind; they wait for them to sync.
	comps.Go("shared informers", o.shared.Start)
	comps.Go("admission policies", o.fences.Run)
	comps.Go("offload grants", o.grants.Run)
	comps.Go("offload credentials", o.credentials.Run)
	comps.Go("namespace offloading", o.offloads.Run)
	comps.Go("namespace requests", o.requests.Run)
	comps.Go("virtual nodes", o.nodes.Run)
	comps.Go("virtual nodes' kubelet API", o.kubelet.Run)
	comps.Go("placement webhook", o.placement.Run)
	comps.Go("offloaded pods", o.pods.Run)
	o.services.start(comps)
	comps.Go("reflection", o.reflection.Run)
	comps.Go("endpoints on third clusters", o.hostedEndpoints.Run)
	return nil
}

// agentNamespace is the agent's own namespace, never mirrored for a
// consumer.
func (a *Agent) agentNamespace() string {
	if a.cfg.Namespace != "" {
		return a.cfg.Namespace
	}
	return "flotilla-system"
}

// ledgerViews translates a provider's pod addresses by the views the
// peering negotiated (offload.Views).
type ledgerViews struct{ l *ipam.Ledger }

func (v ledgerViews) Translate(provider string, addr netip.Addr) (netip.Addr, bool) {
	return v.l.ToLocal(provider, addr)
}

func (v ledgerViews) ToRemote(provider string, addr netip.Addr) (netip.Addr, bool) {
	return v.l.ToRemote(provider, addr)
}

func (v ledgerViews) AsSeenBy(provider string, addr netip.Addr) (netip.Addr, bool) {
	return v.l.AsSeenBy(provider, addr)
}

// engineGrants hands sealed grants to the engine, once there is one.
type engineGrants struct {
	eng *atomic.Pointer[peering.Engine]
}

func (g engineGrants) SetGrant(id string, sealed []byte) error {
	e := g.eng.Load()
	if e == nil {
		return errors.New("the peering engine is not running yet")
	}
	return e.SetGrant(id, sealed)
}

// apiServer finds the address this cluster announces with its grants,
// once: from the flags, or from the cluster (tenancy.FindAPIServer).
func (a *Agent) apiServer() func(context.Context) (tenancy.APIServer, error) {
	var mu sync.Mutex
	var found *tenancy.APIServer
	return func(ctx context.Context) (tenancy.APIServer, error) {
		mu.Lock()
		defer mu.Unlock()
		if found != nil {
			return *found, nil
		}
		s, err := tenancy.FindAPIServer(ctx, a.kube, a.restCfg, a.cfg.APIServerURL, a.cfg.APIServerCA)
		if err != nil {
			return tenancy.APIServer{}, err
		}
		a.log.Info("API server announced to the peers granted offloading", "url", s.URL, "source", s.Source)
		found = &s
		return s, nil
	}
}

// fenceDNSService is the cluster DNS's Service of the flag
// --fence-dns-service, namespace/name.
func fenceDNSService(flag string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(flag, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("--fence-dns-service %q: want namespace/name of the cluster DNS's Service, such as %s", flag, tenancy.DefaultDNSService)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
