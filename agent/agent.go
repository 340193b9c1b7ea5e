// Package agent wires a cluster's Flotilla agent together: configuration,
// the Kubernetes client, the components in their start order (ledger and
// identity, local networks, tunnel, peering, discovery, Peer objects; see
// start.go), and the health and metrics server.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"net/netip"
	"os"
	"regexp"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/agent/gatewayservice"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/apiauth"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/internal/version"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/observe/dashboard"
	"github.com/flotilla-io/flotilla/observe/trace/live"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/offload/mcsdns"
	"github.com/flotilla-io/flotilla/offload/placement"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/policy"
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
	// MetricsAddr serves /healthz and /readyz to anyone, and /metrics,
	// /trace, the dashboard and the profiles to callers whose bearer
	// token may get their path (apiauth); empty disables. Without a
	// host (":9470"), it listens on the loopback and NodeAddress only.
	MetricsAddr string
	// MetricsTrustLoopback serves every path to the loopback without a
	// token too: only where every process in the agent's network
	// namespace (the gateway node's) is trusted with the routing state.
	MetricsTrustLoopback bool
	// Profiling also serves the Go runtime's profiles (net/http/pprof)
	// under /debug/pprof/ on MetricsAddr. Off by default: a profile shows
	// the process's inside to whoever reaches the port, and a CPU
	// profile costs while it runs.
	Profiling bool
	// ShutdownTimeout bounds the stop of all components.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger

	// ClusterName is this cluster's human name, shown on other clusters'
	// Peers.
	ClusterName string
	// ClusterSetName is the clusterset's (the federation's) name, which
	// the agent writes as KEP-2149's ClusterProperty clusterset.k8s.io.
	ClusterSetName string
	// ClusterLabels are this cluster's labels, announced to peers, which
	// show them on their Peer for it (peering.CheckLabels).
	ClusterLabels map[string]string
	// PodCIDRs and ServiceCIDRs are this cluster's networks; empty means
	// read them from the cluster.
	PodCIDRs, ServiceCIDRs []netip.Prefix
	// ReservedCIDRs are ranges no view may use, besides those the agent
	// finds itself (pods, services, the node's networks, Node addresses).
	ReservedCIDRs []netip.Prefix
	// Peering is the policy for Peers whose spec says nothing.
	Peering peering.Policy
	// Announce says what of the pod ranges is announced to peers.
	Announce Announce
	// PodBlockBits is the prefix length of the block each pod's address
	// stands for when the blocks announced are learned from the pods.
	PodBlockBits int
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
	// BehindNAT: nobody can reach this gateway first (outbound
	// connectivity only). Members reach its gossip through the
	// connections it opens, peers learn its WireGuard endpoint from its
	// handshakes, and it cannot peer with a cluster behind NAT too.
	BehindNAT bool
	// GatewayService exposes WireGuard and gossip through a Service of
	// the agent's own of that type (NodePort, LoadBalancer), whose
	// address and ports are advertised instead of AdvertiseAddr's; None
	// (or empty): no Service, and the one an earlier run made is
	// removed (docs/install.md, "Behind NAT or a load balancer").
	GatewayService gatewayservice.Type
	MDNS           bool
	DNSDomains     []string
	// DNSServer overrides the resolver for DNS-SD ("host:port").
	DNSServer string
	Joins     []string
	// GossipProfile is lan or wan.
	GossipProfile string
	// GossipPackets bound the gossip packets (UDP) one source address
	// sends, before they are decrypted (discovery.PacketLimits).
	GossipPackets discovery.PacketLimits

	WireGuard          tunnel.Mode
	WireGuardInterface string
	WireGuardPort      int
	// WireGuardKeyRotation replaces the WireGuard key this often; 0 never.
	// Peers learn the new public key from the next statement.
	WireGuardKeyRotation time.Duration

	// FabricOwner is the agent's Deployment, which owns the fabric's
	// DaemonSet; empty: no fabric (the agent runs outside a Deployment,
	// and only pods on its own node reach the peers).
	FabricOwner string
	// Namespace and NodeName are the agent's pod's (downward API).
	Namespace, NodeName string
	// PodName is the agent's pod (downward API); with LeaderElect the
	// active replica labels it (ha.RoleLabel). Empty: no label.
	PodName string
	// LeaderElect runs the agent as one of several replicas: only the
	// one holding the Lease flotilla-agent starts; the timings are
	// ha.Elector's, zero for its defaults (docs/ha.md).
	LeaderElect                               bool
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// HeartbeatPort is the UDP port, on NodeAddress, replicas ping each
	// other on (ha.Heartbeat): a standby takes over from an active
	// replica that died in about a second, not a lease duration, at the
	// cost of an active replica less patient with a slow API server while
	// a standby does not answer (docs/ha.md). ha.DefaultHeartbeatPort by
	// default; 0, or outside a pod: the Lease alone.
	HeartbeatPort int
	// LedgerSnapshots replicates the ledger into the Secret
	// flotilla-ledger after every change and restores it from there at
	// start when this state directory is behind (docs/ha.md).
	LedgerSnapshots bool

	// OffloadGrants is the policy for Peers whose spec.offloading is
	// empty: manual (never without Grant) or auto.
	OffloadGrants tenancy.GrantPolicy
	// OffloadTo is the policy for the grants of providers whose Peer's
	// spec.offloadTo is empty: manual (held, never used without Accept)
	// or auto.
	OffloadTo remote.UsePolicy
	// OffloadRevokeAfter is how long a consumer may be unreachable
	// before the grant it holds here is revoked and its tenant, with
	// everything it runs here, removed. Far longer than UnreachableGrace:
	// a partition that outlasts the tunnel's grace must not destroy the
	// workloads a consumer offloaded (docs/offload.md, "Revocation").
	OffloadRevokeAfter time.Duration
	// Traffic is the mode for Peers whose spec.traffic is empty: Full
	// (every pod reachable, as routed) or Segregated (docs/policy.md).
	Traffic policy.Mode
	// APIServerURL and APIServerCA (a PEM file) are what this cluster
	// announces to the peers it grants; empty: found in the cluster
	// (tenancy.FindAPIServer).
	APIServerURL, APIServerCA string
	// GrantAudience is the audience of the tokens granted; the API server
	// must accept it. GrantLifetime is their lifetime (renewed at 2/3).
	GrantAudience string
	GrantLifetime time.Duration

	// NodeAddress is where this cluster's API server reaches the agent:
	// the InternalIP of the virtual nodes, whose kubelet API it serves on
	// KubeletPort, and the address of the placement webhook on
	// WebhookPort. Default: $POD_IP (the gateway node's address, the pod
	// being on the host network), else AdvertiseAddr.
	NodeAddress              netip.Addr
	KubeletPort, WebhookPort int
	// WebhookClientCA is whom the placement webhook answers: clients
	// presenting a certificate named one of WebhookClientNames (any,
	// when empty), the API server's, given to it by an
	// AdmissionConfiguration (docs/offload.md), signed by the cluster's
	// client CA (WebhookClientCluster, or empty) or by the CA of a PEM
	// file; WebhookClientAny ("none"): any client.
	WebhookClientCA    string
	WebhookClientNames []string
	// ClustersetDNSPort is where the agent answers the clusterset.local
	// zone on NodeAddress, UDP and TCP (offload/mcsdns); 0: it does not.
	ClustersetDNSPort int
	// ClustersetDNSClientRate and ClustersetDNSClientBurst bound the
	// queries of one client address (mcsdns.Config).
	ClustersetDNSClientRate  float64
	ClustersetDNSClientBurst int
	// CoreDNSForward, "namespace/name", is CoreDNS's ConfigMap, where the
	// agent keeps a block forwarding clusterset.local to its DNS Service
	// (offload/dnsforward); empty: it keeps none, and takes out the one it
	// wrote in kube-system/coredns if there is one.
	CoreDNSForward string
	// FenceDNSService, "namespace/name", is the cluster DNS's Service:
	// the pods of consumers' namespaces may ask its endpoints on port 53
	// (tenancy.TenantsConfig.DNSService). FenceDNSAddresses are DNS
	// servers they may ask besides, such as NodeLocal DNSCache's.
	FenceDNSService   string
	FenceDNSAddresses []netip.Addr
}

// Values of Config.WebhookClientCA besides a file.
const (
	WebhookClientCluster = "cluster"
	WebhookClientAny     = "none"
)

// DefaultConfig returns the defaults of `flotilla agent`.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		StateDir:           agentapi.DefaultStateDir,
		LedgerSnapshots:    true,
		MetricsAddr:        ":9470",
		ShutdownTimeout:    4 * time.Second,
		Logger:             slog.Default(),
		ClusterName:        host,
		ClusterSetName:     "flotilla",
		Peering:            peering.PolicyAuto,
		Announce:           AnnounceAuto,
		PodBlockBits:       DefaultPodBlockBits,
		UnreachableGrace:   5 * time.Minute,
		InstallCRDs:        true,
		KubeletPort:        10260,
		WebhookPort:        9443,
		WebhookClientCA:    WebhookClientCluster,
		WebhookClientNames: placement.DefaultClientNames,
		ClustersetDNSPort:  mcsdns.DefaultPort,
		HeartbeatPort:      ha.DefaultHeartbeatPort,
		GossipAddr:         netip.AddrPortFrom(netip.IPv4Unspecified(), discovery.DefaultGossipPort),
		MDNS:               true,
		GossipProfile:      string(discovery.ProfileLAN),
		GatewayService:     gatewayservice.None,
		WireGuard:          tunnel.ModeAuto,
		WireGuardInterface: tunnel.DefaultInterface,
		WireGuardPort:      tunnel.DefaultPort,
		OffloadGrants:      tenancy.GrantsManual,
		OffloadTo:          remote.UseManual,
		OffloadRevokeAfter: 24 * time.Hour,
		Traffic:            policy.Full,
		GrantAudience:      offload.DefaultAudience,
		GrantLifetime:      time.Hour,
		FenceDNSService:    tenancy.DefaultDNSService.String(),
	}
}

// Agent is one cluster's agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	registry *peerMetrics
	ready    checks

	kube    kubeclient.Interface
	restCfg *rest.Config
	// warm is what a standby readied for its takeover (--leader-elect),
	// nil otherwise; set before the components start.
	warm *warmStandby

	// listeners are bound in New so that a bad address fails at once and
	// callers (tests) can learn the port when asked for ":0".
	listeners []net.Listener
	// guard authenticates and authorizes the metrics port's readers.
	guard *apiauth.Guard
	// fabric is the cluster's fabric plan and nodes its Nodes, once started.
	fabric *fabricPlan
	nodes  clusterNodes
	// podNetworks are this cluster's pod ranges as read at the start, the
	// ones the ledger holds.
	podNetworks []netip.Prefix
	// learned are the pod blocks a CNI with its own IPAM allocated, when
	// watched (cniblocks.go).
	learned learnedBlocks
	// start starts the components (startComponents; tests give their own).
	start func(ctx context.Context, comps *components) error
	// fenced is set while this replica's data path must be gone: another
	// may hold the Lease (election.go). dataPathMu orders fences with
	// the tunnel's start.
	fenced     atomic.Bool
	dataPathMu sync.Mutex
	// services receives the peers' exports from the gossip, once made.
	services atomic.Pointer[mcs.Services]
	// dashboard is what the page at / shows, once the Peers are watched
	// (agent/dashboard.go).
	dashboard atomic.Pointer[dashboard.Source]
	// traced is the tunnel /trace reads, once started (agent/trace.go).
	traced atomic.Pointer[tunnel.Tunnel]
	// now stamps the agent's own state, skew off the host's clock
	// (agent/clock.go).
	now  func() time.Time
	skew time.Duration
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
	if cfg.Announce == "" {
		cfg.Announce = AnnounceAuto
	}
	if _, err := ParseAnnounce(string(cfg.Announce)); err != nil {
		return nil, fmt.Errorf("--announce: %w", err)
	}
	if cfg.PodBlockBits == 0 {
		cfg.PodBlockBits = DefaultPodBlockBits
	}
	if cfg.PodBlockBits < 12 || cfg.PodBlockBits > 32 {
		return nil, fmt.Errorf("--pod-block-bits %d: want a prefix length from 12 to 32, such as 24 (a pod at 10.1.2.3 stands for 10.1.2.0/24)", cfg.PodBlockBits)
	}
	if err := peering.CheckLabels(cfg.ClusterLabels); err != nil {
		return nil, fmt.Errorf("--cluster-label: %w", err)
	}
	if _, err := tunnel.ParseMode(string(cfg.WireGuard)); err != nil {
		return nil, fmt.Errorf("--wireguard: %w", err)
	}
	if cfg.OffloadGrants == "" {
		cfg.OffloadGrants = tenancy.GrantsManual
	}
	if _, err := tenancy.ParseGrantPolicy(string(cfg.OffloadGrants)); err != nil {
		return nil, fmt.Errorf("--offload-grants: %w", err)
	}
	if cfg.OffloadTo == "" {
		cfg.OffloadTo = remote.UseManual
	}
	if _, err := remote.ParseUsePolicy(string(cfg.OffloadTo)); err != nil {
		return nil, fmt.Errorf("--offload-to: %w", err)
	}
	if cfg.OffloadRevokeAfter == 0 {
		cfg.OffloadRevokeAfter = 24 * time.Hour
	}
	if cfg.OffloadRevokeAfter < cfg.UnreachableGrace {
		return nil, fmt.Errorf("--offload-revoke-after %s is shorter than --unreachable-grace %s: a consumer's workloads would go before its tunnel", cfg.OffloadRevokeAfter, cfg.UnreachableGrace)
	}
	gatewaySvc, err := gatewayservice.ParseType(string(cfg.GatewayService))
	if err != nil {
		return nil, fmt.Errorf("--gateway-service: %w", err)
	}
	cfg.GatewayService = gatewaySvc
	if cfg.GatewayService != gatewayservice.None && cfg.BehindNAT {
		return nil, fmt.Errorf("--gateway-service=%s and --behind-nat: a gateway exposed through a Service is reachable; drop one of them", cfg.GatewayService)
	}
	traffic, err := policy.ParseMode(string(cfg.Traffic))
	if err != nil {
		return nil, fmt.Errorf("--traffic: %w", err)
	}
	cfg.Traffic = traffic
	if cfg.GrantLifetime == 0 {
		cfg.GrantLifetime = time.Hour
	}
	if cfg.GrantLifetime < 10*time.Minute {
		return nil, fmt.Errorf("--grant-lifetime %s: the API server issues tokens for 10m at least", cfg.GrantLifetime)
	}
	for _, p := range []struct {
		flag string
		port *int
		def  int
	}{{"--kubelet-port", &cfg.KubeletPort, DefaultConfig().KubeletPort}, {"--webhook-port", &cfg.WebhookPort, DefaultConfig().WebhookPort}} {
		if *p.port == 0 {
			*p.port = p.def
		}
		if *p.port < 1 || *p.port > 65535 {
			return nil, fmt.Errorf("%s %d: want a TCP port, 1 to 65535", p.flag, *p.port)
		}
	}
	if cfg.ClustersetDNSPort < 0 || cfg.ClustersetDNSPort > 65535 {
		return nil, fmt.Errorf("--clusterset-dns-port %d: want a port, 1 to 65535, or 0 to answer no DNS", cfg.ClustersetDNSPort)
	}
	if _, err := coreDNSConfigMap(cfg.CoreDNSForward); err != nil {
		return nil, err
	}
	if _, err := fenceDNSService(cfg.FenceDNSService); err != nil {
		return nil, err
	}
	if cfg.CoreDNSForward != "" && cfg.ClustersetDNSPort == 0 {
		return nil, errors.New("--coredns-forward forwards to the agent's DNS, which --clusterset-dns-port=0 turns off")
	}
	if cfg.FederationKey != "" && cfg.FederationKeyFile != "" {
		return nil, errors.New("give --federation-key or --federation-key-file, not both")
	}
	for _, p := range cfg.ReservedCIDRs {
		if err := ipam.CheckRange(p); err != nil {
			return nil, fmt.Errorf("--reserved-cidr: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", cfg.StateDir, err)
	}
	now, skew, err := clockFromEnv()
	if err != nil {
		return nil, err
	}
	if skew != 0 {
		cfg.Logger.Warn("the agent's clock is skewed for a test", "skew", skew, "env", clockSkewEnv)
	}
	restCfg, err := KubeConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	restCfg.UserAgent = "flotilla-agent/" + version.Version
	kube, err := kubeclient.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, registry: newPeerMetrics(NewRegistry()), kube: kube, restCfg: restCfg, now: now, skew: skew}
	a.start = a.startComponents
	if cfg.MetricsAddr != "" {
		if a.guard, err = apiauth.New(apiauth.Config{Client: kube, TrustLoopback: cfg.MetricsTrustLoopback, Log: cfg.Logger.With("component", "metrics server")}); err != nil {
			return nil, err
		}
		if a.listeners, err = listen(cfg.MetricsAddr, cfg.NodeAddress); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// listen binds the metrics port's addresses (apiauth.Addresses).
func listen(addr string, node netip.Addr) ([]net.Listener, error) {
	addrs, err := apiauth.Addresses(addr, node)
	if err != nil {
		return nil, fmt.Errorf("metrics address: %w", err)
	}
	var ls []net.Listener
	for _, addr := range addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, fmt.Errorf("metrics address %s: %w", addr, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// KubeConfig is the client configuration from a kubeconfig file, or the
// pod's service account when path is empty.
func KubeConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("no --kubeconfig given and not running in a pod (%w); pass --kubeconfig", err)
	}
	// No client-side rate limit, as controller-runtime does: the API
	// server's priority and fairness protects it, while client-go's
	// default (5 a second per API group) held each offloaded namespace
	// a second on the provider. Writers that want a limit set their own.
	cfg.QPS, cfg.Burst = -1, -1
	return cfg, nil
}

// NewRegistry is a metrics registry with the Go, process and build
// collectors every Flotilla process serves.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	build := version.Get()
	r.MustRegister(
		// Besides the MemStats gauges, the heap the last collection
		// found live and the goal of the next: heap in use includes
		// garbage, whose amount GOGC and GOMEMLIMIT set; live is what
		// the process holds.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/(live|goal):bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "flotilla_build_info",
			Help:        "Build of the running agent; always 1.",
			ConstLabels: prometheus.Labels{"version": build.Version, "commit": build.Commit, "goversion": build.GoVersion},
		}, func() float64 { return 1 }),
	)
	return r
}

// MetricsAddrs are all the addresses the health and metrics server
// listens on.
func (a *Agent) MetricsAddrs() []string {
	out := make([]string, 0, len(a.listeners))
	for _, l := range a.listeners {
		out = append(out, l.Addr().String())
	}
	return out
}

// MetricsAddr returns the first address the health and metrics server
// listens on (the loopback, unless a host was given), with the real port
// when ":0" was asked for.
func (a *Agent) MetricsAddr() string {
	if len(a.listeners) == 0 {
		return ""
	}
	return a.listeners[0].Addr().String()
}

// Run runs the agent until ctx is cancelled or a component fails, then
// stops the components in reverse order within ShutdownTimeout, leaving
// the data path up so a restart does not drop traffic. It returns nil
// after a clean stop, and the failure, naming the component, otherwise.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent starting", "version", version.Version, "commit", version.Get().Commit, "stateDir", a.cfg.StateDir, "apiServer", a.restCfg.Host)
	RouteKubernetesLogs(a.log)
	// runCtx ends at the first failure, with it as the cause: a start
	// still under way gives up, a running agent stops.
	runCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	comps := newComponents(a.log, fail)
	var phase atomic.Pointer[string] // what keeps the agent from being ready
	setPhase := func(s string) { phase.Store(&s) }
	setPhase("components still starting")
	a.ready.add("started", func() error {
		if s := *phase.Load(); s != "" {
			return errors.New(s)
		}
		return nil
	})
	a.serve(comps)
	api := a.apiServerProbe()
	comps.Go("API server probe", api.run)
	a.ready.add("kubernetes", api.result)

	start := a.start
	if a.cfg.LeaderElect {
		// A replica's readiness is its process's health, whatever its
		// role: a rollout waits for the standby too, and the Services
		// follow the role's label (election.go), not readiness.
		setPhase("")
		start = a.startElected(a.start)
	} else {
		start = a.startAlone(a.start)
	}
	err := start(runCtx, comps)
	if err == nil {
		setPhase("")
		a.log.Info("agent running")
		<-runCtx.Done()
	}
	switch {
	case ctx.Err() != nil:
		err = nil // asked to stop, even while starting: a clean stop
	case runCtx.Err() != nil:
		err = context.Cause(runCtx)
		a.log.Error("a component failed; stopping the agent", "err", err)
	}
	setPhase("stopping")
	a.log.Info("agent stopping")
	stopCtx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if serr := comps.Stop(stopCtx); serr != nil {
		// Kubernetes kills the pod after its grace period anyway; say
		// what hung instead of being killed silently.
		// The goroutines, grouped by stack, show where it hangs.
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		a.log.Error("components did not stop in time; exiting", "timeout", a.cfg.ShutdownTimeout, "err", serr, "goroutines", stacks.String())
		if err == nil {
			err = fmt.Errorf("stop within %s: %w", a.cfg.ShutdownTimeout, serr)
		}
	}
	if ferr := a.removeFencedDataPath(); ferr != nil {
		a.log.Error("data path not removed", "err", ferr)
	}
	if err == nil {
		a.log.Info("agent stopped")
	}
	return err
}

// serve runs the health and metrics server as the first component, so it
// answers while the others start and stops last.
func (a *Agent) serve(comps *components) {
	if len(a.listeners) == 0 {
		return
	}
	srv := apiauth.NewServer(a.handler())
	comps.Go("health and metrics server", func(ctx context.Context) error {
		served := make(chan error, len(a.listeners))
		for _, l := range a.listeners {
			go func() { served <- srv.Serve(l) }()
		}
		select {
		case err := <-served:
			srv.Close()
			for range len(a.listeners) - 1 {
				<-served
			}
			return err
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
		defer cancel()
		err := srv.Shutdown(sctx)
		for range a.listeners {
			<-served
		}
		return err
	})
	a.log.Info("serving health and metrics", "addrs", a.MetricsAddrs())
}

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/readyz", a.ready.serveReadyz)
	// The rest only to the loopback and to readers the API server says
	// may get the path (the ClusterRole flotilla-metrics-reader).
	guarded := http.NewServeMux()
	// Uncompressed: a gzip writer holds about 1 MiB of Go heap, kept
	// between scrapes or made again at each, for a page that crosses a
	// node's network or the loopback.
	guarded.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry, DisableCompression: true}))
	guarded.Handle(live.Path, a.traceHandler())
	guarded.HandleFunc("/build", serveBuild)
	if a.cfg.Profiling {
		// pprof.Index serves the named profiles (heap, goroutine, ...)
		// below it; the others are handlers of their own.
		guarded.HandleFunc("/debug/pprof/", httppprof.Index)
		guarded.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		guarded.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		guarded.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		guarded.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	}
	// Everything else: the dashboard (its page, graph.svg, graph.json).
	guarded.Handle("/", a.dashboardHandler())
	mux.Handle("/", a.guard.Wrap(guarded))
	return mux
}
