//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/agent/gatewayservice"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/offload/mcsdns"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/peering"
	trafficpolicy "github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/tunnel"
)

func init() { register(newAgentCommand) }

func newAgentCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "agent",
		GroupID: groupNode,
		Short:   "run the agent of this cluster",
		Args:    noArgs,
	}
	cfg := agent.DefaultConfig()
	fs := cmd.Flags()
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the local cluster (default: in-cluster service account)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory of the agent's ledger (identity, keys, views); keep it across restarts")
	fs.BoolVar(&cfg.LeaderElect, "leader-elect", cfg.LeaderElect, "run as one of several replicas: only the one holding the Lease flotilla-agent in the agent's namespace runs the data path, the others wait as standbys (docs/ha.md)")
	fs.DurationVar(&cfg.LeaseDuration, "leader-elect-lease-duration", ha.DefaultLeaseDuration, "with --leader-elect: how long a Lease not renewed keeps a standby from taking over (whole seconds)")
	fs.DurationVar(&cfg.RenewDeadline, "leader-elect-renew-deadline", ha.DefaultRenewDeadline, "with --leader-elect: how long one round of renewal attempts lasts before it starts over; an active replica that cannot renew stops forwarding only once another replica could hold the Lease (docs/ha.md)")
	fs.DurationVar(&cfg.RetryPeriod, "leader-elect-retry-period", ha.DefaultRetryPeriod, "with --leader-elect: how often replicas try to take or renew the Lease; an active replica that cannot renew stops forwarding this long (200ms at least) before another replica could hold the Lease")
	fs.IntVar(&cfg.HeartbeatPort, "heartbeat-port", cfg.HeartbeatPort, "with --leader-elect: UDP port the replicas ping each other on, so that a standby takes over from an active replica that died in about a second rather than a lease duration; the active replica then fences itself after about a second of failed renewals while a standby does not answer (0: off, the Lease alone; docs/ha.md)")
	fs.BoolVar(&cfg.LedgerSnapshots, "ledger-snapshots", cfg.LedgerSnapshots, "replicate the ledger into the Secret flotilla-ledger of the agent's namespace after every change, and restore a state directory that is behind from it at start (docs/ha.md)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "address serving /healthz and /readyz to anyone, and /metrics, /trace, /build and the dashboard to a bearer token allowed the path (empty: off)")
	fs.BoolVar(&cfg.MetricsTrustLoopback, "metrics-trust-loopback", false, "serve every path of --metrics-addr to the loopback without a token: only where every process on the gateway node is trusted with the routing state")
	fs.BoolVar(&cfg.Profiling, "profiling", cfg.Profiling, "also serve the Go runtime's profiles under /debug/pprof/ on --metrics-addr (go tool pprof http://ADDR/debug/pprof/heap); off by default")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")

	fs.StringVar(&cfg.ClusterName, "cluster-name", "", "this cluster's human name, shown on other clusters' Peers (default: the host's name)")
	fs.StringVar(&cfg.ClusterSetName, "clusterset-name", cfg.ClusterSetName, "the federation's name, written as the ClusterProperty clusterset.k8s.io (Multi-Cluster Services)")
	labels := labelFlag{}
	fs.Var(labels, "cluster-label", "a label of this cluster as key=value, repeatable: announced to peers, which show it on their Peer for this cluster (a NamespaceOffload's clusterSelector picks by them); Kubernetes label syntax, no key under flotilla.io/")
	var pods, services, reserved cidrList
	fs.Var(&pods, "pod-cidr", "this cluster's pod network, repeatable or comma-separated (default: read from the cluster)")
	fs.Var(&services, "service-cidr", "this cluster's service network, repeatable or comma-separated (default: read from the cluster)")
	fs.Var(&reserved, "reserved-cidr", "a range views of peers' networks must never use, repeatable or comma-separated; the node's networks and Node addresses count without it")
	announce := fs.String("announce", string(cfg.Announce), "what of the pod network peers are told: range (the whole --pod-cidr), blocks (the pod blocks in use, aggregated: the Nodes' spec.podCIDRs, Calico's BlockAffinities, CiliumNodes or the pods' addresses), or auto (range when a peer can remap it, no larger than a remap pool (/11); blocks otherwise)")
	fs.IntVar(&cfg.PodBlockBits, "pod-block-bits", cfg.PodBlockBits, "when no Node has spec.podCIDRs and neither Calico's BlockAffinities nor CiliumNodes are served, the pod blocks announced are learned from the pods' addresses: each address stands for its block of this prefix length (24: a pod at 10.1.2.3 stands for 10.1.2.0/24)")
	policy := fs.String("peering", string(cfg.Peering), "auto: connect every federation member; manual: only Peers whose spec.networking is Accept")
	fs.DurationVar(&cfg.UnreachableGrace, "unreachable-grace", cfg.UnreachableGrace, "how long an unreachable peer keeps its tunnel and view")
	fs.BoolVar(&cfg.InstallCRDs, "install-crds", cfg.InstallCRDs, "install the flotilla.io CRDs at start")

	fs.StringVar(&cfg.FederationKey, "federation-key", "", "join token or base64 federation key; visible in ps, prefer --federation-key-file (default: the key in the state dir, generated at first start)")
	fs.StringVar(&cfg.FederationKeyFile, "federation-key-file", "", "file holding a join token or federation key")
	gossip := addrPortFlag{&cfg.GossipAddr}
	fs.Var(gossip, "gossip-addr", "address:port gossip listens on (UDP and TCP)")
	advertise := addrFlag{&cfg.AdvertiseAddr}
	fs.Var(advertise, "advertise-addr", "address other clusters reach this gateway at (default: the default route's source address)")
	fs.BoolVar(&cfg.BehindNAT, "behind-nat", cfg.BehindNAT, "this gateway has outbound connectivity only (behind NAT, nothing gets in): it opens the gossip and the tunnels to reachable peers and keeps them open; it cannot peer with another cluster behind NAT")
	gatewaySvc := fs.String("gateway-service", string(cfg.GatewayService), "None: peers reach this gateway at --advertise-addr; NodePort or LoadBalancer: the agent exposes WireGuard (UDP) and gossip (TCP and UDP) through a Service of that type of its own, flotilla-gateway in its namespace, and advertises the gateway node's address and the node ports (listening on those ports) or the load balancer's address; back to None removes the Service")
	fs.BoolVar(&cfg.MDNS, "mdns", cfg.MDNS, "advertise and browse _flotilla._udp with mDNS on the LAN")
	fs.StringArrayVar(&cfg.DNSDomains, "dns-domain", nil, "domain to browse for _flotilla._udp SRV records, repeatable")
	fs.StringVar(&cfg.DNSServer, "dns-server", "", "DNS server for --dns-domain as host:port (default: /etc/resolv.conf)")
	fs.StringArrayVar(&cfg.Joins, "join", nil, "gossip address (host:port) of a member to join, repeatable")
	fs.StringVar(&cfg.GossipProfile, "gossip-profile", cfg.GossipProfile, "gossip timings: lan or wan")

	wg := fs.String("wireguard", string(cfg.WireGuard), "WireGuard implementation: auto (kernel when available), kernel or userspace")
	fs.StringVar(&cfg.WireGuardInterface, "wireguard-interface", cfg.WireGuardInterface, "WireGuard interface name (unique per host)")
	fs.IntVar(&cfg.WireGuardPort, "wireguard-port", cfg.WireGuardPort, "WireGuard UDP port")
	fs.DurationVar(&cfg.WireGuardKeyRotation, "wireguard-key-rotation", 0, "replace the WireGuard key this often, e.g. 720h (0: never)")

	fs.StringVar(&cfg.FabricOwner, "fabric-owner", "", "the agent's Deployment, which owns the fabric's DaemonSet that brings every node into the federation (empty: no fabric, only the gateway node's pods reach peers)")
	fs.StringVar(&cfg.Namespace, "namespace", "", "the agent's namespace, for the fabric (default: $POD_NAMESPACE)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "the gateway node's name, for the fabric (default: $NODE_NAME)")
	fs.StringVar(&cfg.PodName, "pod-name", "", "the agent's pod, which with --leader-elect the active replica labels flotilla.io/gateway-role=active for the agent's Services to select (default: $POD_NAME)")

	traffic := fs.String("traffic", string(cfg.Traffic), "Full: a peer's traffic reaches every pod here; Segregated: only its offloaded pods and the Services reflected or exported to it (docs/policy.md); a Peer's spec.traffic overrides it")
	fs.DurationVar(&cfg.OffloadRevokeAfter, "offload-revoke-after", cfg.OffloadRevokeAfter, "how long a consumer may be unreachable before its grant here is revoked and its tenant, with what it runs here, removed (at least --unreachable-grace)")
	grants := fs.String("offload-grants", string(cfg.OffloadGrants), "manual: a peer may offload here only when its Peer's spec.offloading is Grant (flotilla grant); auto: every peer not denied")
	offloadTo := fs.String("offload-to", string(cfg.OffloadTo), "manual: this cluster offloads to a peer that granted it only when the peer's Peer says spec.offloadTo: Accept; auto: to every peer that granted it, unless its Peer says Deny")
	fs.StringVar(&cfg.APIServerURL, "api-server-url", "", "this cluster's API server as the peers granted offloading reach it, https://host:port (default: kube-public/cluster-info, then the kubernetes EndpointSlice)")
	fs.StringVar(&cfg.APIServerCA, "api-server-ca", "", "PEM file of the CA bundle that verifies --api-server-url (default: with the URL found, or the agent's own)")
	fs.StringVar(&cfg.GrantAudience, "grant-audience", cfg.GrantAudience, "audience of the tokens granted to peers; the API server must accept it (kube-apiserver --api-audiences)")
	fs.DurationVar(&cfg.GrantLifetime, "grant-lifetime", cfg.GrantLifetime, "lifetime of the tokens granted to peers (10m at least); each is renewed at two thirds of it")
	nodeAddr := addrFlag{&cfg.NodeAddress}
	fs.Var(nodeAddr, "node-address", "address this cluster's API server reaches the agent at, for the virtual nodes' kubelet API and the placement webhook (default: $POD_IP, else --advertise-addr)")
	fs.IntVar(&cfg.KubeletPort, "kubelet-port", cfg.KubeletPort, "port of the kubelet API the virtual nodes serve (kubectl logs and exec on offloaded pods)")
	fs.IntVar(&cfg.WebhookPort, "webhook-port", cfg.WebhookPort, "port of the placement webhook (pods of offloaded namespaces)")
	fs.StringVar(&cfg.WebhookClientCA, "webhook-client-ca", cfg.WebhookClientCA, "whose client certificates the placement webhook answers (the API server presents one to admission webhooks when an AdmissionConfiguration gives it one): cluster, the cluster's client CA (kube-system/extension-apiserver-authentication); a PEM file of a CA; none, any client, for an API server that cannot be given one")
	webhookNames := fs.String("webhook-client-names", strings.Join(cfg.WebhookClientNames, ","), "comma-separated common names of the client certificates the placement webhook accepts; empty: any --webhook-client-ca signed")
	fs.IntVar(&cfg.ClustersetDNSPort, "clusterset-dns-port", cfg.ClustersetDNSPort, "port, UDP and TCP on --node-address, where the agent answers the clusterset.local zone of the Multi-Cluster Services API for CoreDNS to forward to (0: no DNS)")
	fs.Float64Var(&cfg.ClustersetDNSClientRate, "clusterset-dns-client-rate", mcsdns.DefaultClientRate, "queries a second one client address may ask the clusterset DNS; past it UDP queries are dropped and TCP ones answered REFUSED")
	fs.IntVar(&cfg.ClustersetDNSClientBurst, "clusterset-dns-client-burst", mcsdns.DefaultClientBurst, "queries one client address may ask the clusterset DNS at once, above --clusterset-dns-client-rate")
	fs.Float64Var(&cfg.GossipPackets.SourceRate, "gossip-packet-rate", discovery.DefaultPacketRate, "gossip packets (UDP) a second one source address may send before its packets are dropped unread")
	fs.IntVar(&cfg.GossipPackets.SourceBurst, "gossip-packet-burst", discovery.DefaultPacketBurst, "gossip packets one source address may send at once, above --gossip-packet-rate")
	fs.StringVar(&cfg.CoreDNSForward, "coredns-forward", cfg.CoreDNSForward, "namespace/name of CoreDNS's ConfigMap (kube-system/coredns) where the agent keeps a block forwarding clusterset.local, and the reverse zones of the peers' views, to its DNS Service, and nothing else (needs deploy/coredns-forward); empty: none, and the block of an earlier run is taken out")
	fs.StringVar(&cfg.FenceDNSService, "fence-dns-service", cfg.FenceDNSService, "namespace/name of the cluster DNS's Service: the pods of consumers' namespaces here may ask its endpoints on port 53, UDP and TCP, even where they are node addresses (a DNS in the host network), of which the fence opens nothing else")
	fs.Var(addrList{&cfg.FenceDNSAddresses}, "fence-dns-address", "address of a DNS server the pods of consumers' namespaces may ask on port 53, UDP and TCP, besides the cluster DNS's endpoints, even where the fence denies it otherwise; repeatable or comma-separated: NodeLocal DNSCache's (169.254.20.10, or the address its pods are given)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if cfg.ClusterName == "" {
			cfg.ClusterName = agent.DefaultConfig().ClusterName
		}
		if cfg.Namespace == "" {
			cfg.Namespace = os.Getenv("POD_NAMESPACE")
		}
		if cfg.NodeName == "" {
			cfg.NodeName = os.Getenv("NODE_NAME")
		}
		if cfg.PodName == "" {
			cfg.PodName = os.Getenv("POD_NAME")
		}
		cfg.PodCIDRs, cfg.ServiceCIDRs, cfg.ReservedCIDRs = pods, services, reserved
		cfg.ClusterLabels = labels
		cfg.GatewayService = gatewayservice.Type(*gatewaySvc)
		return runAgent(cmd.Context(), cmd.ErrOrStderr(), cfg, agentChoices{
			webhookNames: *webhookNames, logFormat: *logFormat, logLevel: *logLevel, peering: *policy, announce: *announce,
			wireguard: *wg, grants: *grants, offloadTo: *offloadTo, traffic: *traffic,
		})
	}
	return cmd
}

// agentChoices are the agent's flags read as words, checked when it
// starts.
type agentChoices struct {
	webhookNames, logFormat, logLevel                        string
	peering, announce, wireguard, grants, offloadTo, traffic string
}

func runAgent(ctx context.Context, stderr io.Writer, cfg agent.Config, f agentChoices) error {
	cfg.WebhookClientNames = nil
	if f.webhookNames != "" {
		cfg.WebhookClientNames = strings.Split(f.webhookNames, ",")
	}
	if cfg.Profiling {
		// A heap sample every 16 KiB allocated (default 512 KiB): fine
		// enough to put a few KiB on each peer or pod. Set before the
		// agent allocates: the profile scales every sample by the rate
		// of the moment.
		runtime.MemProfileRate = 16 << 10
	}
	logger, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return usageError{err: err}
	}
	cfg.Logger = logger
	if v := os.Getenv("POD_IP"); !cfg.NodeAddress.IsValid() && v != "" {
		if cfg.NodeAddress, err = netip.ParseAddr(v); err != nil {
			return fmt.Errorf("$POD_IP %q (the default of --node-address): %w", v, err)
		}
	}
	if cfg.Peering, err = peering.ParsePolicy(f.peering); err != nil {
		return usageErrorf("--peering: %v", err)
	}
	if cfg.Announce, err = agent.ParseAnnounce(f.announce); err != nil {
		return usageErrorf("--announce: %v", err)
	}
	if cfg.WireGuard, err = tunnel.ParseMode(f.wireguard); err != nil {
		return usageErrorf("--wireguard: %v", err)
	}
	if cfg.OffloadGrants, err = tenancy.ParseGrantPolicy(f.grants); err != nil {
		return usageErrorf("--offload-grants: %v", err)
	}
	if cfg.OffloadTo, err = remote.ParseUsePolicy(f.offloadTo); err != nil {
		return usageErrorf("--offload-to: %v", err)
	}
	if cfg.Traffic, err = trafficpolicy.ParseMode(f.traffic); err != nil {
		return usageErrorf("--traffic: %v", err)
	}
	if cfg.GatewayService, err = gatewayservice.ParseType(string(cfg.GatewayService)); err != nil {
		return usageErrorf("--gateway-service: %v", err)
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// cidrList is a repeatable, comma-separated list of canonical CIDRs.
type cidrList []netip.Prefix

func (l *cidrList) String() string {
	parts := make([]string, len(*l))
	for i, p := range *l {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}
func (l *cidrList) Type() string { return "cidrs" }
func (l *cidrList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		p, err := agent.ParseCIDR(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		*l = append(*l, p)
	}
	return nil
}

// labelFlag is a repeatable key=value label, each checked as it is given.
type labelFlag map[string]string

func (l labelFlag) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}
func (l labelFlag) Type() string { return "key=value" }
func (l labelFlag) Set(v string) error {
	key, value, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("%q: want key=value, e.g. region=eu-west", v)
	}
	if old, dup := l[key]; dup && old != value {
		return fmt.Errorf("%s given twice, as %q and %q", key, old, value)
	}
	if err := peering.CheckLabel(key, value); err != nil {
		return err
	}
	l[key] = value
	return nil
}

type addrPortFlag struct{ p *netip.AddrPort }

func (f addrPortFlag) String() string {
	if f.p == nil || !f.p.IsValid() {
		return ""
	}
	return f.p.String()
}
func (f addrPortFlag) Type() string { return "address:port" }
func (f addrPortFlag) Set(v string) error {
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return fmt.Errorf("want address:port, e.g. 0.0.0.0:7946: %w", err)
	}
	*f.p = ap
	return nil
}

// addrList is a repeatable, comma-separated list of addresses.
type addrList struct{ p *[]netip.Addr }

func (l addrList) String() string {
	if l.p == nil {
		return ""
	}
	parts := make([]string, len(*l.p))
	for i, a := range *l.p {
		parts[i] = a.String()
	}
	return strings.Join(parts, ",")
}
func (l addrList) Type() string { return "addresses" }
func (l addrList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("want IP addresses, comma-separated: %w", err)
		}
		*l.p = append(*l.p, a)
	}
	return nil
}

type addrFlag struct{ p *netip.Addr }

func (f addrFlag) String() string {
	if f.p == nil || !f.p.IsValid() {
		return ""
	}
	return f.p.String()
}
func (f addrFlag) Type() string { return "address" }
func (f addrFlag) Set(v string) error {
	a, err := netip.ParseAddr(v)
	if err != nil {
		return fmt.Errorf("want an IP address: %w", err)
	}
	*f.p = a
	return nil
}
