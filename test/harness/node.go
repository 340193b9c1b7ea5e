package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
)

// NodeOptions configure a real node. The zero value works.
type NodeOptions struct {
	// Network is the cluster's node network. Nil: the control plane's own
	// LAN, created with its first node.
	Network *LAN
	// Role, when set, labels the node RoleLabel=<Role> ("gateway",
	// "worker"), for node selectors.
	Role string
	// Images are more image tarballs to import into the node's containerd,
	// besides PauseImage and TestServerImage (e.g. bin/flotilla-image.tar).
	Images []string
	// PodCIDR is the node's CNI range, given directly where the control
	// plane allocates none (ControlPlaneOptions.NoNodeCIDRs): inside the
	// cluster's PodCIDR; the Node's spec.podCIDRs stays empty.
	PodCIDR netip.Prefix
}

// RoleLabel is the node label NodeOptions.Role sets.
const RoleLabel = "test.flotilla.io/role"

// Node is a real Kubernetes node: a network namespace on the cluster's node
// network (interface eth0) with its own containerd, kubelet and kube-proxy
// (nftables), and a CNI bridge ("cni0") handing out addresses from the
// node's slice of the cluster's pod network. Pods run as real containers.
type Node struct {
	*Netns
	NodeName string
	// Addr is the node's address on the node network (its InternalIP).
	Addr netip.Addr
	// PodCIDR is the node's slice of the cluster's pod network, as the
	// controller manager allocated it (spec.podCIDRs), or as given
	// (NodeOptions.PodCIDR).
	PodCIDR netip.Prefix
	// Containerd, Kubelet and KubeProxy are the node's processes; their
	// logs are in the run directory (Logs).
	Containerd, Kubelet, KubeProxy *Process
	// Flannel is the node's flanneld where the cluster runs flannel
	// (ControlPlaneOptions.Flannel); nil otherwise.
	Flannel *Process
	// NetworkPolicy is the node's kube-network-policies where the cluster
	// enforces NetworkPolicy (ControlPlaneOptions.NetworkPolicy); nil
	// otherwise.
	NetworkPolicy *Process

	cp     *ControlPlane
	paths  nodePaths
	cgroup string // kubelet's cgroupRoot, at the top of every hierarchy
	lan    *LAN

	stopOnce sync.Once
	stopErr  error
	killed   atomic.Bool // Kill was called: nothing to drain
}

// StartNode starts a real node of the control plane's cluster and returns
// once the Node is Ready. The control plane needs a PodCIDR; its scheduler
// is started if it is not running. The node is stopped, and everything it
// made removed, when the test ends.
func (cp *ControlPlane) StartNode(name string, opts NodeOptions) *Node {
	cp.env.t.Helper()
	n, err := cp.startNode(name, opts)
	if err != nil {
		cp.env.fatalf("node %s of %s: %v", name, cp.Name, err)
	}
	return n
}

// StartNodes starts several nodes with the same options at once.
func (cp *ControlPlane) StartNodes(opts NodeOptions, names ...string) []*Node {
	cp.env.t.Helper()
	specs := make([]NodeSpec, len(names))
	for i, name := range names {
		specs[i] = NodeSpec{CP: cp, Name: name, Options: opts}
	}
	return cp.env.StartNodes(specs...)
}

// NodeSpec is one node for Env.StartNodes: the control plane of its
// cluster, its name and its options.
type NodeSpec struct {
	CP      *ControlPlane
	Name    string
	Options NodeOptions
}

// StartNodes starts nodes of one cluster or several, each with its own
// options (a gateway and workers), all at once, and returns them in order.
func (e *Env) StartNodes(specs ...NodeSpec) []*Node {
	e.t.Helper()
	nodes := make([]*Node, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = spec.CP.startNode(spec.Name, spec.Options)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("node %s of %s: %w", spec.Name, spec.CP.Name, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		e.fatalf("%v", err)
	}
	return nodes
}

func (cp *ControlPlane) startNode(name string, opts NodeOptions) (*Node, error) {
	e := cp.env
	if err := checkName("node", name); err != nil {
		return nil, err
	}
	if !cp.Options.PodCIDR.IsValid() || cp.Options.PodCIDR.Addr().Is6() {
		return nil, errors.New("real nodes need an IPv4 ControlPlaneOptions.PodCIDR, from which each node gets its slice")
	}
	given := opts.PodCIDR
	if cp.Options.NoNodeCIDRs != given.IsValid() || given.IsValid() && (given != given.Masked() || given.Bits() < cp.Options.PodCIDR.Bits() || !cp.Options.PodCIDR.Contains(given.Addr())) {
		return nil, fmt.Errorf("node pod range %v: want one inside %s exactly when the control plane allocates none (NoNodeCIDRs %v)", given, cp.Options.PodCIDR, cp.Options.NoNodeCIDRs)
	}
	if cp.Options.Flannel && cp.Options.NoNodeCIDRs {
		return nil, errors.New("flannel's Kubernetes subnet manager takes each node's slice from spec.podCIDRs: Flannel needs a control plane that allocates them (NoNodeCIDRs false)")
	}
	if err := e.claimSysctls(); err != nil {
		return nil, err
	}
	if err := e.ensureInotifyRoom(inotifyHeadroom/2, "real nodes"); err != nil {
		return nil, err
	}
	if err := cp.startScheduler(); err != nil {
		return nil, err
	}
	lan := opts.Network
	if lan == nil {
		var err error
		if lan, err = cp.nodeNetwork(); err != nil {
			return nil, err
		}
	}
	if err := cp.installDNS(); err != nil {
		return nil, err
	}
	images := []string{}
	for _, img := range []string{PauseImage, TestServerImage} {
		path, err := imageTarball(img)
		if err != nil {
			return nil, err
		}
		images = append(images, path)
	}
	dns, err := coreDNSImageTarball()
	if err != nil {
		return nil, err
	}
	images = append(images, dns)
	images = append(images, opts.Images...)

	ns, err := e.newNetns(cp.Name + "-" + name)
	if err != nil {
		return nil, err
	}
	n := &Node{
		Netns: ns, NodeName: name, cp: cp, lan: lan, PodCIDR: given,
		paths:  newNodePaths(filepath.Join(cp.dir, "nodes", name)),
		cgroup: e.name(cp.Name + "-" + name),
	}
	// Runs after the node's processes have stopped (registered before
	// them), also when the node failed half way through its start.
	e.t.Cleanup(func() {
		if err := n.removeLeftovers(); err != nil {
			e.t.Logf("harness: node %s: %v", name, err)
		}
	})
	if err := n.setUpNetwork(); err != nil {
		return nil, err
	}
	if err := n.paths.mkdirs(); err != nil {
		return nil, err
	}
	if err := createCgroup(n.cgroup); err != nil {
		return nil, err
	}
	if err := n.startContainerd(images); err != nil {
		return nil, err
	}
	if err := n.startKubelet(opts.Role); err != nil {
		return nil, err
	}
	if err := n.setUpPodNetwork(); err != nil {
		return nil, err
	}
	if err := n.startKubeProxy(); err != nil {
		return nil, err
	}
	if cp.Options.NetworkPolicy {
		if err := n.startNetworkPolicy(); err != nil {
			return nil, err
		}
	}
	// Registered last, so it runs first: pods go while kubelet and
	// containerd still run to tear down their networks. The first node's
	// cleanup to run stops every node of the run (stopNodes).
	e.mu.Lock()
	e.nodes = append(e.nodes, n)
	e.mu.Unlock()
	e.t.Cleanup(func() {
		// Deferred, so a check that fails (Fatalf ends this function)
		// does not keep the nodes from stopping.
		defer e.stopNodes()
		e.nodesStopping()
	})
	if err := n.waitReady(90 * time.Second); err != nil {
		return nil, err
	}
	return n, nil
}

// nodeNetwork returns the control plane's own node network, creating it
// with the first node.
func (cp *ControlPlane) nodeNetwork() (*LAN, error) {
	cp.nodesMu.Lock()
	defer cp.nodesMu.Unlock()
	if cp.nodeLAN == nil {
		lan, err := cp.env.newLAN(cp.Name + "n")
		if err != nil {
			return nil, fmt.Errorf("node network: %w", err)
		}
		cp.nodeLAN = lan
	}
	return cp.nodeLAN, nil
}

// setUpNetwork attaches the node to the node network, lets it forward, and
// relays the API server into it (127.0.0.1:port, as on the host).
func (n *Node) setUpNetwork() error {
	var err error
	if n.Addr, err = n.lan.attach(n.Netns, "eth0", "n-"+n.cp.Name+"-"+n.NodeName); err != nil {
		return err
	}
	// Reverse-path filtering off; with flannel, loose (2) as systemd sets
	// it on most distributions: flannel routes the other nodes' slices
	// through flannel.1, so what reaches a node from another's pod on
	// eth0 (the fabric's direct routes) is checked loosely, as on a real
	// flannel node.
	rp := "0"
	if n.cp.Options.Flannel {
		rp = "2"
	}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.rp_filter", rp},
		{"net.ipv4.conf.default.rp_filter", rp},
	} {
		if err := n.sysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := n.forwardFromHost(n.cp.Addr); err != nil {
		return fmt.Errorf("relay the API server into %s: %w", n.Name, err)
	}
	// The service range out of eth0, as a real node's default route takes
	// it: without a route a process of the node's own network (CoreDNS
	// forwarding to a ClusterIP, say) fails before kube-proxy's rules
	// rewrite the destination.
	svc := n.cp.Options.ServiceCIDR
	eth0, err := n.nl.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := n.nl.RouteReplace(&netlink.Route{
		Dst:       &net.IPNet{IP: svc.Addr().AsSlice(), Mask: net.CIDRMask(svc.Bits(), svc.Addr().BitLen())},
		LinkIndex: eth0.Attrs().Index, Scope: netlink.SCOPE_LINK,
	}); err != nil {
		return fmt.Errorf("route the service range %s on node %s: %w", svc, n.NodeName, err)
	}
	n.cp.egress.route(netip.PrefixFrom(n.Addr, 32), n.Netns)
	return nil
}

// startNodeProcess runs argv inside the node's network namespace but in
// the host's mount namespace: `ip netns exec` would remount /sys and hide
// the cgroup v1 hierarchies from kubelet.
func (n *Node) startNodeProcess(component string, argv ...string) (*Process, error) {
	p, err := n.cp.env.start(n.cp.Name+"-"+n.NodeName+"-"+component, []string{"nsenter", "--net=" + n.Path, "--"}, argv)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", component, err)
	}
	return p, nil
}

func (n *Node) startContainerd(images []string) error {
	if err := os.WriteFile(n.paths.containerdConfig, []byte(containerdConfig(n.paths)), 0o644); err != nil {
		return err
	}
	var err error
	if n.Containerd, err = n.startNodeProcess("containerd", "containerd", "--config", n.paths.containerdConfig); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := n.Ctr(ctx, "version"); err == nil {
			break
		}
		if exited, _ := n.Containerd.Exited(); exited {
			return n.Containerd.exitError()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd does not answer on %s:\n%s", n.paths.containerdSock, n.Containerd.Tail(15))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := n.checkCRI(ctx); err != nil {
		return err
	}
	for _, img := range images {
		if err := n.ImportImage(img); err != nil {
			return err
		}
	}
	return nil
}

// checkCRI fails when the node's containerd runs without its CRI plugin:
// containerd only warns when the plugin fails to load (out of inotify
// instances, say), and kubelet would then exit with "unknown service
// runtime.v1.RuntimeService", which hides why.
func (n *Node) checkCRI(ctx context.Context) error {
	out, err := n.Ctr(ctx, "plugins", "ls")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		// TYPE ID PLATFORMS STATUS
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri" {
			if status := f[len(f)-1]; status != "ok" {
				return fmt.Errorf("containerd of node %s runs without its CRI plugin (%s), which kubelet needs; last lines of containerd (log: %s):\n%s",
					n.NodeName, status, n.Containerd.LogPath, n.Containerd.Tail(15))
			}
			return nil
		}
	}
	return fmt.Errorf("containerd of node %s lists no CRI plugin (io.containerd.grpc.v1 cri):\n%s", n.NodeName, out)
}

// devicePluginSocket is where every kubelet of the host listens for device
// plugins, whatever its --root-dir (the path is fixed in kubelet). A
// starting kubelet empties the directory and then binds it: two kubelets
// starting at once can remove each other's socket file between the two,
// and the second bind fails ("address already in use"), killing it.
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// kubeletStartLock serializes that window host-wide, across test processes.
var kubeletStartLock = filepath.Join(lockDir, "kubelet-start.lock")

// withKubeletStartLock runs fn holding the host-wide kubelet start lock.
func withKubeletStartLock(fn func() error) error { return withHostLock(kubeletStartLock, fn) }

// waitDevicePluginSocket returns once the kubelet just started has bound
// its device plugin socket (a new file where before was), has exited, or
// 20 s passed. The tests use no device plugin: the
// next kubelet may take the path over, as long as this one has bound
// first. (File times would not do: they come from a coarse clock.)
func (n *Node) waitDevicePluginSocket(before fileID) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if id := socketInode(devicePluginSocket); id != (fileID{}) && id != before {
			return
		}
		if exited, _ := n.Kubelet.Exited(); exited {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fileID tells one file at a path from the next: its inode and change
// time (an inode number may be reused at once, within one tick of the
// coarse clock file times come from hardly); zero if there is none.
type fileID struct {
	ino  uint64
	ctim unix.Timespec
}

func socketInode(path string) fileID {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return fileID{}
	}
	return fileID{st.Ino, st.Ctim}
}

// Ctr runs containerd's ctr against the node's containerd, in the
// namespace Kubernetes uses (k8s.io).
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{"-a", n.paths.containerdSock, "-n", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, "ctr", argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s on node %s: %w: %s", strings.Join(args, " "), n.NodeName, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// ImportImage imports an image tarball into the node's containerd, where
// pods with imagePullPolicy Never find it.
func (n *Node) ImportImage(tarball string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := n.Ctr(ctx, "images", "import", tarball)
	return err
}

func (n *Node) startKubelet(role string) error {
	cp := n.cp
	if err := cp.writeClientKubeconfig(n.paths.kubeletKubeconfig, "system:node:"+n.NodeName, "system:nodes"); err != nil {
		return err
	}
	cfg, err := kubeletConfig(n.paths, cp.pki.caCert, "/"+n.cgroup, n.Addr, cp.DNSAddr())
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.paths.kubeletConfig, cfg, 0o644); err != nil {
		return err
	}
	argv := []string{
		filepath.Join(KubeBinDir(), "kubelet"),
		"--config", n.paths.kubeletConfig,
		"--kubeconfig", n.paths.kubeletKubeconfig,
		"--root-dir", n.paths.kubeletRoot,
		"--cert-dir", n.paths.kubeletPKI,
		"--hostname-override", n.NodeName,
		"--node-ip", n.Addr.String(),
		"-v", "1",
	}
	if role != "" {
		argv = append(argv, "--node-labels", RoleLabel+"="+role)
	}
	if err := withKubeletStartLock(func() error {
		before := socketInode(devicePluginSocket)
		if n.Kubelet, err = n.startNodeProcess("kubelet", argv...); err != nil {
			return err
		}
		n.waitDevicePluginSocket(before)
		return nil
	}); err != nil {
		return err
	}
	n.Kubelet.quiet = true
	if n.PodCIDR.IsValid() {
		return nil // given, not allocated
	}
	// The node's slice of the pod network comes from the controller
	// manager once the kubelet has registered the Node.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var exited bool
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, _ = n.Kubelet.Exited(); exited {
			return false, n.Kubelet.exitError()
		}
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, n.NodeName, metav1.GetOptions{})
		if err != nil || len(node.Spec.PodCIDRs) == 0 {
			return false, nil
		}
		n.PodCIDR, err = netip.ParsePrefix(node.Spec.PodCIDRs[0])
		return err == nil, err
	})
	switch {
	case exited:
		return err
	case err != nil:
		return fmt.Errorf("node %s registered with no pod range: %w\nlast lines of kubelet (log: %s):\n%s", n.NodeName, err, n.Kubelet.LogPath, n.Kubelet.Tail(15))
	}
	return nil
}

// setUpPodNetwork writes the node's CNI network and routes the node's pod
// slice between it and the cluster's other nodes, as a simple CNI (flannel
// in host-gw mode) would.
func (n *Node) setUpPodNetwork() error {
	cp := n.cp
	flannel := cp.Options.Flannel
	conf, err := cniConfig(n.paths, n.cgroup, bridgeNetwork{Slice: n.PodCIDR, Routes: []netip.Prefix{defaultRoute}})
	if flannel {
		// flanneld routes the other nodes' slices through its VXLAN
		// device itself.
		conf, err = n.startFlannel()
	}
	if err != nil {
		return err
	}
	tmp := filepath.Join(n.paths.cniConfDir, ".10-flotest.conflist")
	if err := os.WriteFile(tmp, conf, 0o644); err != nil {
		return err
	}
	// containerd watches the directory: the file appears whole.
	if err := os.Rename(tmp, filepath.Join(n.paths.cniConfDir, "10-flotest.conflist")); err != nil {
		return err
	}
	cp.egress.route(n.PodCIDR, n.Netns)
	cp.nodesMu.Lock()
	defer cp.nodesMu.Unlock()
	for _, other := range cp.nodes {
		if other.lan != n.lan || flannel || other.Killed() {
			continue // a killed node routes nothing: its link is down
		}
		if err := other.routeTo(n); err != nil {
			return err
		}
		if err := n.routeTo(other); err != nil {
			return err
		}
	}
	cp.nodes = append(cp.nodes, n)
	return nil
}

// routeTo routes other's pod slice via other's node address.
func (n *Node) routeTo(other *Node) error {
	dst := other.PodCIDR
	err := n.nl.RouteReplace(&netlink.Route{
		Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)},
		Gw:  other.Addr.AsSlice(),
	})
	if err != nil {
		return fmt.Errorf("route %s via %s on node %s: %w", dst, other.Addr, n.NodeName, err)
	}
	return nil
}

func (n *Node) startKubeProxy() error {
	cp := n.cp
	if err := cp.writeClientKubeconfig(n.paths.proxyKubeconfig, "system:kube-proxy"); err != nil {
		return err
	}
	cfg, err := kubeProxyConfig(n.paths, n.NodeName, cp.Options.PodCIDR)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.paths.proxyConfig, cfg, 0o644); err != nil {
		return err
	}
	if n.KubeProxy, err = n.startNodeProcess("kube-proxy", filepath.Join(KubeBinDir(), "kube-proxy"), "--config", n.paths.proxyConfig, "-v", "1"); err != nil {
		return err
	}
	n.KubeProxy.quiet = true
	return nil
}

// waitReady waits until the Node reports Ready (its CNI network is
// loaded, its runtime answers).
func (n *Node) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, p := range []*Process{n.Containerd, n.Kubelet, n.KubeProxy} {
			if exited, _ := p.Exited(); exited {
				return false, p.exitError()
			}
		}
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = c.Reason + ": " + c.Message
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready (%s): %w\nlast lines of kubelet:\n%s", n.NodeName, last, err, n.Kubelet.Tail(15))
	}
	return nil
}

// Logs returns what one of the node's components ("containerd",
// "kubelet", "kube-proxy") has printed so far.
func (n *Node) Logs(component string) string {
	switch component {
	case "containerd":
		return n.Containerd.Log()
	case "kubelet":
		return n.Kubelet.Log()
	case "kube-proxy":
		return n.KubeProxy.Log()
	}
	return fmt.Sprintf("no component %q on node %s (want containerd, kubelet or kube-proxy)", component, n.NodeName)
}

// Stop stops the node before the test ends: its pods are deleted (their
// networks torn down by the CNI), then kube-proxy, kubelet and containerd
// stop, whatever still runs in the node's cgroups is killed, and its
// containerd shims exit. Mounts, cgroups and links go when the test ends.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() { n.stopErr = n.stop() })
	return n.stopErr
}

func (n *Node) stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !n.Killed() {
		if err := n.drain(ctx); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
	}
	for _, p := range []*Process{n.NetworkPolicy, n.KubeProxy, n.Kubelet, n.Flannel} {
		if p != nil {
			p.Stop()
		}
	}
	if err := killCgroup(n.cgroup); err != nil {
		errs = append(errs, err)
	}
	if n.Containerd != nil {
		n.Containerd.Stop()
	}
	n.killShims()
	n.cp.forgetNode(n)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop node %s: %w", n.NodeName, err)
	}
	return nil
}

// forgetNode removes the node from the cluster's routing and the API.
func (cp *ControlPlane) forgetNode(n *Node) {
	cp.egress.unroute(n.Netns)
	cp.nodesMu.Lock()
	for i, m := range cp.nodes {
		if m == n {
			cp.nodes = append(cp.nodes[:i], cp.nodes[i+1:]...)
			break
		}
	}
	cp.nodesMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cp.Client.CoreV1().Nodes().Delete(ctx, n.NodeName, metav1.DeleteOptions{})
}

// killShims kills the containerd shims of this node's containerd: they
// outlive containerd on purpose, and each holds its pod's processes.
func (n *Node) killShims() {
	for _, p := range harnessProcesses() {
		if p.run != n.cp.env.RunID || !strings.HasPrefix(p.cmd, "containerd-shim") {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", fmt.Sprint(p.pid), "cmdline"))
		if bytes.Contains(cmdline, []byte(n.paths.containerdSock+"\x00")) {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// drainNodes drains, once per cluster and all at once, every real node
// of the cluster when the test ends: no pod moves to a node that is about
// to stop.
func (cp *ControlPlane) drainNodes() {
	cp.drain.Do(func() {
		cp.nodesMu.Lock()
		nodes := append([]*Node(nil), cp.nodes...)
		cp.nodesMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cp.stopDNS(ctx)
		var wg sync.WaitGroup
		for _, n := range nodes {
			if n.Killed() {
				continue // no kubelet left to stop its pods
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := n.drain(ctx); err != nil && !cp.env.t.Failed() {
					cp.env.t.Logf("harness: drain node %s: %v", n.NodeName, err)
				}
			}()
		}
		wg.Wait()
	})
}

// drain cordons the node (no replacement pod lands there), deletes its
// pods with grace 0 and waits until their processes are gone from the
// node's cgroups: the kubelet has stopped their sandboxes and the CNI has
// torn down their networks. DaemonSet pods stay, as with `kubectl drain
// --ignore-daemonsets`: their DaemonSet would put them back at once
// (they tolerate the cordon); they go with the node's cgroups when it
// stops.
func (n *Node) drain(ctx context.Context) error {
	nodes := n.cp.Client.CoreV1().Nodes()
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := nodes.Patch(ctx, n.NodeName, "application/strategic-merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cordon: %w", err)
	}
	pods, err := n.cp.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", n.NodeName).String(),
	})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	zero := int64(0)
	daemons := map[string]bool{}
	for _, p := range pods.Items {
		if owner := metav1.GetControllerOf(&p); owner != nil && owner.Kind == "DaemonSet" {
			daemons["pod"+string(p.UID)] = true
			continue
		}
		n.cp.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return len(cgroupProcessesBut(n.cgroup, daemons)) == 0, nil
	})
}

// removeLeftovers removes what the node made outside its processes and
// network namespace: its mounts, cgroups, log links and CNI cache files.
// The namespace itself (with the node's bridge and veths) goes after.
func (n *Node) removeLeftovers() error {
	var errs []error
	if err := killCgroup(n.cgroup); err != nil {
		errs = append(errs, err)
	}
	n.killShims()
	removeRuntimeFiles(filepath.Dir(n.paths.containerdRoot))
	if err := unmountUnder(n.paths.dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroup(n.cgroup); err != nil {
		errs = append(errs, err)
	}
	prefix := n.paths.dir + "/"
	for _, link := range containerLogLinks(n.cp.env.RunID) {
		if target, err := os.Readlink(link); err == nil && strings.HasPrefix(target, prefix) {
			os.Remove(link)
		}
	}
	for _, f := range cniCacheFiles(n.cp.env.RunID) {
		if strings.HasPrefix(filepath.Base(f), n.cgroup+"-") {
			os.Remove(f)
		}
	}
	return errors.Join(errs...)
}

// Memory returns the resident memory of the node's processes: containerd,
// kubelet, kube-proxy, its shims and its containers.
func (n *Node) Memory() int64 {
	pids := cgroupProcesses(n.cgroup)
	for _, p := range []*Process{n.Containerd, n.Kubelet, n.KubeProxy} {
		if p != nil {
			pids = append(pids, p.Pid())
		}
	}
	for _, p := range harnessProcesses() {
		if p.run != n.cp.env.RunID || !strings.HasPrefix(p.cmd, "containerd-shim") {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", fmt.Sprint(p.pid), "cmdline"))
		if bytes.Contains(cmdline, []byte(n.paths.containerdSock+"\x00")) {
			pids = append(pids, p.pid)
		}
	}
	return residentMemory(pids)
}

// Memory returns the resident memory of the control plane's processes.
func (cp *ControlPlane) Memory() int64 {
	var pids []int
	for _, p := range []*Process{cp.Etcd, cp.APIServer, cp.ControllerManager, cp.Scheduler} {
		if p != nil {
			pids = append(pids, p.Pid())
		}
	}
	return residentMemory(pids)
}

// residentMemory sums VmRSS of distinct processes, in bytes.
func residentMemory(pids []int) int64 {
	seen := map[int]bool{}
	var total int64
	for _, pid := range pids {
		if seen[pid] {
			continue
		}
		seen[pid] = true
		b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				var kb int64
				fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
				total += kb * 1024
			}
		}
	}
	return total
}
