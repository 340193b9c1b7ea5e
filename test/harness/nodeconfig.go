package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// nodePaths are the files and directories of one real node, all inside the
// run directory.
type nodePaths struct {
	dir                     string
	containerdRoot          string
	containerdState         string
	containerdSock          string
	containerdConfig        string
	runcRoot                string
	cniConfDir, cniIPAMDir  string
	kubeletRoot, kubeletPKI string
	kubeletConfig           string
	kubeletKubeconfig       string
	proxyConfig             string
	proxyKubeconfig         string
	podLogs                 string
}

func newNodePaths(dir string) nodePaths {
	return nodePaths{
		dir:               dir,
		containerdRoot:    filepath.Join(dir, "containerd", "root"),
		containerdState:   filepath.Join(dir, "containerd", "state"),
		containerdSock:    filepath.Join(dir, "containerd", "containerd.sock"),
		containerdConfig:  filepath.Join(dir, "containerd", "config.toml"),
		runcRoot:          filepath.Join(dir, "containerd", "runc"),
		cniConfDir:        filepath.Join(dir, "cni", "net.d"),
		cniIPAMDir:        filepath.Join(dir, "cni", "ipam"),
		kubeletRoot:       filepath.Join(dir, "kubelet"),
		kubeletPKI:        filepath.Join(dir, "kubelet-pki"),
		kubeletConfig:     filepath.Join(dir, "kubelet.yaml"),
		kubeletKubeconfig: filepath.Join(dir, "kubelet.kubeconfig"),
		proxyConfig:       filepath.Join(dir, "kube-proxy.yaml"),
		proxyKubeconfig:   filepath.Join(dir, "kube-proxy.kubeconfig"),
		podLogs:           filepath.Join(dir, "pod-logs"),
	}
}

func (p nodePaths) mkdirs() error {
	for _, d := range []string{p.containerdRoot, p.containerdState, p.runcRoot, p.cniConfDir, p.cniIPAMDir, p.kubeletRoot, p.kubeletPKI, p.podLogs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig is containerd's configuration for one node: its own
// root, state, sockets and runc root; the settings found
// necessary on these machines.
func containerdConfig(p nodePaths) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
# Plugins a test node never uses: less to start, nothing else to clean.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # This machine's bounding set lacks CAP_SYS_RESOURCE: without this, runc
  # cannot lower oom_score_adj and every sandbox fails to start.
  restrict_oom_score_adj = true
  # Pod network namespaces are mounted under the state directory, inside
  # the run directory, rather than in the host-wide /run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, p.containerdRoot, p.containerdState, p.containerdSock, p.containerdSock+".ttrpc",
		filepath.Join(p.dir, "containerd", "opt"), PauseImage, p.runcRoot, CNIBinDir, p.cniConfDir)
}

// kubeletConfig is the KubeletConfiguration of one node (JSON is YAML).
// Pods resolve through the cluster DNS at clusterDNS (ControlPlane.DNSAddr).
func kubeletConfig(p nodePaths, caFile, cgroupRoot string, nodeIP, clusterDNS netip.Addr) ([]byte, error) {
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"address":    nodeIP.String(),
		"port":       10250,
		// No unauthenticated port; health on loopback inside the node.
		"readOnlyPort":       0,
		"healthzPort":        10248,
		"healthzBindAddress": "127.0.0.1",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": caFile},
		},
		"authorization":            map[string]any{"mode": "Webhook"},
		"containerRuntimeEndpoint": "unix://" + p.containerdSock,
		// Every node of the machine shares its cgroup v1 hierarchies: each
		// kubelet gets a root of its own there.
		"cgroupDriver":  "cgroupfs",
		"cgroupRoot":    cgroupRoot,
		"failCgroupV1":  false,
		"failSwapOn":    false,
		"podLogsDir":    p.podLogs,
		"clusterDomain": ClusterDomain,
		"clusterDNS":    []string{clusterDNS.String()},
		"resolvConf":    "/etc/resolv.conf",
		// Several nodes share one disk and one memory: eviction would
		// react to the others.
		"evictionHard": map[string]string{
			"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
			"imagefs.available": "1%", "imagefs.inodesFree": "1%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		// Without a node's own iptables chains kubelet leaves the node's
		// netfilter to kube-proxy.
		"makeIPTablesUtilChains":    false,
		"protectKernelDefaults":     false,
		"nodeStatusReportFrequency": "10s",
		"shutdownGracePeriod":       "0s",
		"staticPodPath":             "",
		"maxPods":                   110,
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// kubeProxyConfig is the KubeProxyConfiguration of one node: nftables, no
// conntrack sysctls (they are host-wide or read-only in a namespace).
func kubeProxyConfig(p nodePaths, nodeName string, clusterCIDR netip.Prefix) ([]byte, error) {
	cfg := map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"mode":             "nftables",
		"hostnameOverride": nodeName,
		"clusterCIDR":      clusterCIDR.String(),
		"clientConnection": map[string]any{"kubeconfig": p.proxyKubeconfig},
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
		"metricsBindAddress": "127.0.0.1:10249",
		"healthzBindAddress": "127.0.0.1:10256",
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// defaultRoute is 0.0.0.0/0.
var defaultRoute = netip.MustParsePrefix("0.0.0.0/0")

// bridgeNetwork is what a node's CNI network gives the bridge plugin: the
// node's slice for host-local, the bridge's address in it, the pods'
// MTU and their routes through the bridge.
type bridgeNetwork struct {
	Slice   netip.Prefix
	Gateway netip.Addr // zero: the slice's first address
	MTU     int        // zero: the bridge's own
	Routes  []netip.Prefix
}

// cniConfig is the node's CNI network: bridge cni0 as the pods' gateway,
// with host-local addresses from the node's slice of the cluster's pod
// network. The network's name carries the run, so CNI's host-wide cache
// files are recognisably ours.
func cniConfig(p nodePaths, network string, b bridgeNetwork) ([]byte, error) {
	rng := map[string]string{"subnet": b.Slice.String()}
	if b.Gateway.IsValid() {
		rng["gateway"] = b.Gateway.String()
	}
	var routes []map[string]string
	for _, r := range b.Routes {
		routes = append(routes, map[string]string{"dst": r.String()})
	}
	bridge := map[string]any{
		"type":        "bridge",
		"bridge":      "cni0",
		"isGateway":   true,
		"ipMasq":      false,
		"hairpinMode": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{rng}},
			"routes":  routes,
			"dataDir": p.cniIPAMDir,
		},
	}
	if b.MTU != 0 {
		bridge["mtu"] = b.MTU
	}
	return json.MarshalIndent(map[string]any{"cniVersion": "0.4.0", "name": network, "plugins": []any{bridge}}, "", "  ")
}

// writeClientKubeconfig writes a kubeconfig for user with a client
// certificate issued by the control plane's CA.
func (cp *ControlPlane) writeClientKubeconfig(path, user string, groups ...string) error {
	cert, key, err := cp.pki.issueClient(user, groups...)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cp.Name] = &clientcmdapi.Cluster{Server: "https://" + cp.Addr.String(), CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts[cp.Name] = &clientcmdapi.Context{Cluster: cp.Name, AuthInfo: user}
	cfg.CurrentContext = cp.Name
	return clientcmd.WriteToFile(*cfg, path)
}
