// Package agent wires a cluster's Flotilla agent together: configuration,
// the Kubernetes client, the components in their start order (ledger,
// identity, discovery, peering, tunnel), and the health and metrics server.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Config is what the agent needs to start. DefaultConfig fills it with
// values that work.
type Config struct {
	// Kubeconfig is the path of a kubeconfig file for the local cluster;
	// empty means the in-cluster service account.
	Kubeconfig string
	// StateDir holds the ledger (identity, keys, views). Created 0700.
	StateDir string
	// MetricsAddr serves /healthz, /readyz and /metrics; empty disables.
	MetricsAddr string
	// ShutdownTimeout bounds the stop of all components.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger

	// ClusterName is this cluster's human name, shown on other clusters'
	// Peers.
	ClusterName string
	// PodCIDRs and ServiceCIDRs are this cluster's networks; empty means
	// read them from the cluster.
	PodCIDRs, ServiceCIDRs []netip.Prefix
	// Peering is the policy for Peers whose spec says nothing.
	Peering peering.Policy
	// UnreachableGrace: how long a failed member keeps tunnel and view.
	UnreachableGrace time.Duration
	// InstallCRDs applies the embedded CRDs at start.
	InstallCRDs bool

	// FederationKey is a join token or a base64 federation key; with
	// FederationKeyFile, a file holding one. Neither: the key stored in the
	// ledger, generated at first start.
	FederationKey, FederationKeyFile string
	// GossipAddr is where gossip listens.
	GossipAddr netip.AddrPort
	// AdvertiseAddr is the address other clusters reach this gateway at,
	// for gossip and WireGuard; default: the default route's source.
	AdvertiseAddr netip.Addr
	MDNS          bool
	DNSDomains    []string
	// DNSServer overrides the resolver for DNS-SD ("host:port").
	DNSServer string
	Joins     []string
	// GossipProfile is lan or wan.
	GossipProfile string

	WireGuard          tunnel.Mode
	WireGuardInterface string
	WireGuardPort      int
	// WireGuardKeyRotation replaces the WireGuard key this often; 0 never.
	// Peers learn the new public key from the next statement.
	WireGuardKeyRotation time.Duration
}

// DefaultConfig returns the defaults of `flotilla agent`.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		StateDir:           "/var/lib/flotilla",
		MetricsAddr:        ":9470",
		ShutdownTimeout:    4 * time.Second,
		Logger:             slog.Default(),
		ClusterName:        host,
		Peering:            peering.PolicyAuto,
		UnreachableGrace:   5 * time.Minute,
		InstallCRDs:        true,
		GossipAddr:         netip.AddrPortFrom(netip.IPv4Unspecified(), discovery.DefaultGossipPort),
		MDNS:               true,
		GossipProfile:      string(discovery.ProfileLAN),
		WireGuard:          tunnel.ModeAuto,
		WireGuardInterface: tunnel.DefaultInterface,
		WireGuardPort:      tunnel.DefaultPort,
	}
}

// Ledger keys the agent stores besides what ipam and peering keep.
const (
	keyIdentity        = "identity"
	keyWireGuard       = "wireguard"
	keyFederation      = "federation-keyring"
	keyGossipAdvertise = "gossip-advertise"
)

// Agent is one cluster's agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	ready    checks

	kube    kubernetes.Interface
	restCfg *rest.Config

	// listener is bound in New so that a bad address fails at once and
	// callers (tests) can learn the port when asked for ":0".
	listener net.Listener
}

// New validates cfg and prepares the agent; it starts nothing.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultConfig().ShutdownTimeout
	}
	if cfg.StateDir == "" {
		return nil, errors.New("state directory: empty; set --state-dir")
	}
	if _, err := peering.ParsePolicy(string(cfg.Peering)); err != nil {
		return nil, fmt.Errorf("--peering: %w", err)
	}
	if _, err := tunnel.ParseMode(string(cfg.WireGuard)); err != nil {
		return nil, fmt.Errorf("--wireguard: %w", err)
	}
	if cfg.FederationKey != "" && cfg.FederationKeyFile != "" {
		return nil, errors.New("give --federation-key or --federation-key-file, not both")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", cfg.StateDir, err)
	}
	restCfg, err := kubeConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	restCfg.UserAgent = "flotilla-agent/" + Version
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, registry: newRegistry(), kube: kube, restCfg: restCfg}
	if cfg.MetricsAddr != "" {
		if a.listener, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("metrics address %s: %w", cfg.MetricsAddr, err)
		}
	}
	return a, nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig given and not running in a pod (%w); pass --kubeconfig", err)
	}
	return cfg, nil
}

func newRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "flotilla_build_info",
			Help:        "Build of the running agent; always 1.",
			ConstLabels: prometheus.Labels{"version": Version, "commit": BuildCommit(), "goversion": runtime.Version()},
		}, func() float64 { return 1 }),
	)
	return r
}

// MetricsAddr returns the address the health and metrics server listens
// on, with the real port when ":0" was asked for.
func (a *Agent) MetricsAddr() string {
	if a.listener == nil {
		return ""
	}
	return a.listener.Addr().String()
}

// Run runs the agent until ctx is cancelled, then stops everything within
// ShutdownTimeout, leaving the data path up so a restart does not drop
// traffic. It returns nil after a clean stop.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent starting", "version", Version, "commit", BuildCommit(), "stateDir", a.cfg.StateDir, "apiServer", a.restCfg.Host)
	var srv *http.Server
	srvErr := make(chan error, 1)
	if a.listener != nil {
		srv = &http.Server{Handler: a.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { srvErr <- srv.Serve(a.listener) }()
		a.log.Info("serving health and metrics", "addr", a.MetricsAddr())
	}
	a.ready.add("kubernetes", a.watchAPIServer(ctx))
	// Not ready until every component is up, in order.
	var started atomic.Bool
	a.ready.add("started", func() error {
		if !started.Load() {
			return errors.New("components still starting")
		}
		return nil
	})

	compCtx, stopComponents := context.WithCancel(ctx)
	stack, startErr := a.start(compCtx)
	var err error
	switch {
	case startErr != nil && ctx.Err() != nil:
		// Stopped while starting: a clean stop, not a failure.
	case startErr != nil:
		err = startErr
	default:
		started.Store(true)
		select {
		case <-ctx.Done():
		case err = <-srvErr:
			err = fmt.Errorf("health and metrics server: %w", err)
		}
	}
	a.log.Info("agent stopping")
	stopCtx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	stopComponents()
	stopped := make(chan struct{})
	go func() { stack.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-stopCtx.Done():
		// Kubernetes kills the pod after its grace period anyway; say
		// what hung instead of being killed silently.
		a.log.Error("components did not stop in time; exiting", "timeout", a.cfg.ShutdownTimeout)
		if err == nil {
			err = fmt.Errorf("components did not stop within %s", a.cfg.ShutdownTimeout)
		}
	}
	if srv != nil {
		if serr := srv.Shutdown(stopCtx); serr != nil && err == nil {
			err = fmt.Errorf("stop health and metrics server: %w", serr)
		}
	}
	if err == nil {
		a.log.Info("agent stopped")
	}
	return err
}

// stopStack holds what start started, to stop it in reverse order.
type stopStack []func()

func (s stopStack) stop() {
	for i := len(s) - 1; i >= 0; i-- {
		s[i]()
	}
}

// start brings the components up in their order: ledger, identity,
// networks, CRDs, tunnel, discovery, peering.
func (a *Agent) start(ctx context.Context) (stopStack, error) {
	var stack stopStack
	ledger, err := ipam.Open(filepath.Join(a.cfg.StateDir, ipam.FileName), ipam.Options{})
	if err != nil {
		return stack, fmt.Errorf("open ledger: %w", err)
	}
	stack = append(stack, func() { ledger.Close() })
	a.ready.add("ledger", func() error {
		_, err := os.Stat(ledger.Path()) // deleted under a running agent: say so
		return err
	})

	seed, err := ledger.LoadOrCreateKey(keyIdentity, func() ([]byte, error) {
		id, err := identity.Generate()
		return id.Seed(), err
	})
	if err != nil {
		return stack, fmt.Errorf("identity: %w", err)
	}
	id, err := identity.FromSeed(seed)
	if err != nil {
		return stack, fmt.Errorf("identity in the ledger: %w", err)
	}
	a.log.Info("identity", "clusterID", id.ClusterID(), "name", a.cfg.ClusterName)

	nets, err := detectNetworks(ctx, a.kube, a.cfg.PodCIDRs, a.cfg.ServiceCIDRs)
	if err != nil {
		return stack, err
	}
	a.log.Info("local networks", "pods", nets.Pods, "from", nets.PodSource, "services", nets.Services, "servicesFrom", nets.ServiceSource)
	advertise := a.cfg.AdvertiseAddr
	if !advertise.IsValid() {
		if advertise, err = defaultAddress(); err != nil {
			return stack, err
		}
	}
	// The gateway's own address is local too: a peer range that covers it
	// is remapped rather than routed into the tunnel.
	locals := []ipam.LocalNetwork{{Range: netip.PrefixFrom(advertise, advertise.BitLen()), Kind: ipam.NodeNetwork}}
	for _, p := range nets.Pods {
		locals = append(locals, ipam.LocalNetwork{Range: p, Kind: ipam.PodNetwork})
	}
	for _, p := range nets.Services {
		locals = append(locals, ipam.LocalNetwork{Range: p, Kind: ipam.ServiceNetwork})
	}
	conflicts, err := ledger.SetLocalNetworks(locals)
	if err != nil {
		return stack, fmt.Errorf("record local networks: %w", err)
	}
	for _, c := range conflicts {
		view, err := ledger.Remap(c.View.Peer, c.View.Remote)
		if err != nil {
			return stack, fmt.Errorf("remap the view of %s's %s, which now overlaps a local network: %w", c.View.Peer, c.View.Remote, err)
		}
		a.log.Warn("view remapped: it overlapped a local network", "peer", c.View.Peer, "range", c.View.Remote, "old", c.View.View, "new", view)
	}

	// The tunnel routes IPv4 only for now: IPv6 pod ranges stay local
	// networks in the ledger (views avoid them) but are not announced.
	var announced []netip.Prefix
	for _, p := range nets.Pods {
		if !p.Addr().Is4() {
			a.log.Warn("IPv6 pod range not announced to peers: the tunnel routes IPv4 only", "range", p)
			continue
		}
		if err := peering.CheckNetwork(p); err != nil {
			return stack, fmt.Errorf("pod range %s cannot be announced to peers: %w", p, err)
		}
		announced = append(announced, p)
	}
	if len(announced) == 0 {
		return stack, fmt.Errorf("no IPv4 pod range among %v: the tunnel routes IPv4 only; pass --pod-cidr with this cluster's IPv4 pod range", nets.Pods)
	}

	if a.cfg.InstallCRDs {
		if err := installCRDs(ctx, a.restCfg); err != nil {
			return stack, err
		}
	}

	keyBytes, err := ledger.LoadOrCreateKey(keyWireGuard, func() ([]byte, error) {
		k, err := tunnel.GeneratePrivateKey()
		return k[:], err
	})
	if err != nil {
		return stack, fmt.Errorf("WireGuard key: %w", err)
	}
	wgKey, err := tunnel.KeyFromBytes(keyBytes)
	if err != nil {
		return stack, fmt.Errorf("WireGuard key in the ledger: %w", err)
	}
	tun, err := tunnel.New(tunnel.Config{
		Interface: a.cfg.WireGuardInterface, Mode: a.cfg.WireGuard, ListenPort: a.cfg.WireGuardPort,
		PrivateKey: wgKey, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return stack, fmt.Errorf("tunnel: %w", err)
	}
	stack = append(stack, func() { tun.Close() })
	go func() {
		if err := tun.Run(ctx); err != nil && ctx.Err() == nil {
			a.log.Error("tunnel repair loop stopped", "err", err)
		}
	}()
	a.ready.add("tunnel", func() error {
		_, err := tun.Status() // the WireGuard device answers
		return err
	})
	if a.cfg.WireGuardKeyRotation > 0 {
		go a.rotateWireGuardKey(ctx, ledger, tun, a.cfg.WireGuardKeyRotation)
	}
	endpoint := netip.AddrPortFrom(advertise, uint16(a.cfg.WireGuardPort))

	keys, err := a.federationKeys(ledger)
	if err != nil {
		return stack, err
	}
	var engine atomic.Pointer[peering.Engine]
	gossipAdvertise := netip.AddrPortFrom(advertise, a.cfg.GossipAddr.Port())
	disc, err := discovery.New(discovery.Config{
		Identity: id, Keys: keys.keys,
		BindAddr: a.cfg.GossipAddr, AdvertiseAddr: gossipAdvertise, Endpoint: endpoint.String(),
		MDNS: a.cfg.MDNS, DNSDomains: a.cfg.DNSDomains, DNSServer: a.cfg.DNSServer,
		Seeds: append(append([]string{}, a.cfg.Joins...), keys.seeds...), Profile: discovery.Profile(a.cfg.GossipProfile),
		OnMessage: func(msg []byte) {
			if e := engine.Load(); e != nil {
				e.Receive(msg)
			}
		},
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return stack, fmt.Errorf("discovery: %w", err)
	}
	if err := ledger.PutKey(keyGossipAdvertise, []byte(gossipAdvertise.String())); err != nil {
		return stack, fmt.Errorf("record the gossip address: %w", err)
	}

	objects, err := peerapi.New(a.restCfg, a.log.With("component", "peers"))
	if err != nil {
		return stack, err
	}
	eng, err := peering.New(peering.Config{
		Identity: id, Name: a.cfg.ClusterName, Policy: a.cfg.Peering,
		Networks: announced, Endpoint: endpoint,
		Ledger: ledger, Dataplane: tun, Transport: disc, Publisher: objects,
		UnreachableGrace: a.cfg.UnreachableGrace,
		Logger:           a.log, Metrics: a.registry,
	})
	if err != nil {
		return stack, err
	}
	engine.Store(eng)
	engineDone := make(chan struct{})
	go func() {
		defer close(engineDone)
		if err := eng.Run(ctx); err != nil {
			a.log.Error("peering stopped", "err", err)
		}
	}()
	stack = append(stack, func() { <-engineDone })
	select {
	case <-eng.Ready():
	case <-engineDone:
		return stack, errors.New("peering engine stopped while starting")
	}
	a.ready.add("peering", func() error {
		select {
		case <-engineDone:
			return errors.New("peering engine stopped")
		default:
			return nil
		}
	})

	if err := disc.Start(ctx); err != nil {
		return stack, fmt.Errorf("discovery: %w", err)
	}
	stack = append(stack, func() { disc.Close() })
	go func() {
		for ev := range disc.Subscribe(ctx) {
			eng.MemberChanged(peering.Member{
				ClusterID: ev.Member.ClusterID, PublicKey: ev.Member.Record.PublicKey,
				Gossip: ev.Member.Gossip.String(), Alive: ev.Kind == discovery.Join || ev.Kind == discovery.Update,
			})
		}
	}()
	a.ready.add("discovery", func() error {
		if disc.Snapshot().Gossip == "" {
			return errors.New("gossip not running")
		}
		return nil
	})
	peersDone := make(chan struct{})
	var peersErr error
	go func() { defer close(peersDone); peersErr = objects.Run(ctx, eng) }()
	stack = append(stack, func() { <-peersDone })
	select {
	case <-objects.Synced():
	case <-peersDone:
		return stack, peersErr
	}
	a.ready.add("peers", func() error {
		select {
		case <-peersDone:
			return fmt.Errorf("Peer objects: %v", peersErr)
		default:
			return nil
		}
	})
	a.log.Info("agent running", "clusterID", id.ClusterID(), "gossip", gossipAdvertise, "wireguard", endpoint, "policy", a.cfg.Peering)
	return stack, nil
}

// rotateWireGuardKey replaces the WireGuard key every period: stored first,
// so a crash in between leaves the ledger and the device agreeing at the
// next start, then set on the device. The peering engine announces the new
// public key in its next statement (within a second); peers apply it, and
// traffic resumes after one handshake.
func (a *Agent) rotateWireGuardKey(ctx context.Context, ledger *ipam.Ledger, tun *tunnel.Tunnel, every time.Duration) {
	rotations := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flotilla_wireguard_key_rotations_total", Help: "WireGuard key rotations.",
	})
	a.registry.MustRegister(rotations)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k, err := tunnel.GeneratePrivateKey()
		if err == nil {
			err = ledger.PutKey(keyWireGuard, k[:])
		}
		if err == nil {
			err = tun.SetPrivateKey(k)
		}
		if err != nil {
			a.log.Error("cannot rotate the WireGuard key", "err", err)
			continue
		}
		rotations.Inc()
		a.log.Info("WireGuard key rotated", "publicKey", k.PublicKey())
	}
}

type federation struct {
	keys  [][]byte
	seeds []string
}

// federationKeys returns the keyring from the flags or the ledger,
// generating one at first start, and stores it so `flotilla token` can
// print it.
func (a *Agent) federationKeys(ledger *ipam.Ledger) (federation, error) {
	given := a.cfg.FederationKey
	if given != "" {
		a.log.Warn("the federation key was given on the command line, where every process on this host can read it; prefer --federation-key-file")
	}
	if a.cfg.FederationKeyFile != "" {
		b, err := os.ReadFile(a.cfg.FederationKeyFile)
		if err != nil {
			return federation{}, fmt.Errorf("--federation-key-file: %w", err)
		}
		given = string(b)
	}
	if given != "" {
		tok, err := discovery.ParseFederationKey(given)
		if err != nil {
			return federation{}, fmt.Errorf("federation key: %w", err)
		}
		ring, err := discovery.EncodeKeyring([][]byte{tok.Key})
		if err != nil {
			return federation{}, err
		}
		if err := ledger.PutKey(keyFederation, ring); err != nil {
			return federation{}, fmt.Errorf("store the federation key: %w", err)
		}
		return federation{keys: [][]byte{tok.Key}, seeds: tok.Seeds}, nil
	}
	ring, err := ledger.LoadOrCreateKey(keyFederation, func() ([]byte, error) {
		k, err := discovery.GenerateFederationKey()
		if err != nil {
			return nil, err
		}
		a.log.Info("generated a new federation key; `flotilla token` prints a join token for other clusters")
		return discovery.EncodeKeyring([][]byte{k})
	})
	if err != nil {
		return federation{}, fmt.Errorf("federation key: %w", err)
	}
	keys, err := discovery.DecodeKeyring(ring)
	if err != nil {
		return federation{}, fmt.Errorf("federation keyring in the ledger: %w", err)
	}
	return federation{keys: keys}, nil
}

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/readyz", a.ready.serveReadyz)
	mux.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry}))
	return mux
}
