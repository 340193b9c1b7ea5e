package harness

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControlPlaneOptions configure a control plane. The zero value works.
type ControlPlaneOptions struct {
	// PodCIDR is the cluster's pod network. When set, the controller
	// manager allocates each Node a /24 of it (spec.podCIDR).
	PodCIDR netip.Prefix
	// NoNodeCIDRs, with PodCIDR, has the controller manager allocate no
	// Node a pod range: spec.podCIDRs stays empty, as with a CNI that
	// has its own IPAM (Calico's, Cilium's cluster-pool), and each real
	// node's CNI range is given directly (NodeOptions.PodCIDR).
	NoNodeCIDRs bool
	// Flannel, with PodCIDR, makes flannel every real node's CNI
	// (flanneld with the Kubernetes subnet manager, the vxlan backend and
	// its own masquerade; Node.startFlannel) in place of the harness's
	// bridge with a route to each other node's slice.
	Flannel bool
	// NetworkPolicy runs kube-network-policies on every real node
	// (Node.startNetworkPolicy), so that the cluster enforces
	// NetworkPolicy, as Calico or Cilium would; the harness's bridge
	// and flannel do not.
	NetworkPolicy bool
	// ServiceCIDR defaults to 10.96.0.0/16.
	ServiceCIDR netip.Prefix
	// Scheduler also starts kube-scheduler.
	Scheduler bool
	// ClientQPS, when set, is the client-side limit of the controller
	// manager and the scheduler (--kube-api-qps, bursts of twice as
	// many); zero keeps theirs (20 and 50 a second), which hold a
	// Deployment of a thousand pods to a minute whatever runs them.
	ClientQPS int
	// LAN, when set, gives the API server an address on it as well
	// (LANURL, port 6443, named by its serving certificate), so that
	// other clusters' sites and nodes on the LAN reach it as across a
	// real network. It still listens on loopback for Config.
	LAN *LAN
	// KubeletCA, when set, is the PEM bundle the API server verifies
	// kubelets' serving certificates with (--kubelet-certificate-authority),
	// as production clusters do; nil: it does not verify them. Real nodes'
	// kubelets serve self-signed certificates, which fail it.
	KubeletCA []byte
}

const serviceAccountIssuer = "https://kubernetes.default.svc"

// OffloadAudience is the audience of grant tokens, which every control
// plane's API server accepts besides its own. It repeats
// offload.DefaultAudience: importing offload here would make an import
// cycle of the tests of the packages below it (ipam's, say), which
// import the harness.
const OffloadAudience = "flotilla.io/offload"

// ControlPlane is a running Kubernetes control plane: its own etcd, a real
// kube-apiserver and kube-controller-manager, and optionally kube-scheduler,
// all on loopback.
type ControlPlane struct {
	Name string
	// Addr is where the API server listens (127.0.0.1:port).
	Addr netip.AddrPort
	// LANAddr is the API server's address on ControlPlaneOptions.LAN
	// (invalid when none); LANURL is its URL.
	LANAddr netip.Addr
	// Config is an admin rest.Config (client certificate in
	// system:masters).
	Config *rest.Config
	// Kubeconfig is the path of an admin kubeconfig file with the same
	// credentials, usable by kubectl and by agents.
	Kubeconfig string
	Client     kubernetes.Interface
	Options    ControlPlaneOptions

	env    *Env
	dir    string
	pki    *pki
	egress *egressProxy

	nodesMu sync.Mutex
	nodes   []*Node // real nodes, for routes between them
	nodeLAN *LAN    // the default node network
	drain   sync.Once

	// The cluster DNS, installed with the first node (installDNS).
	dnsOnce sync.Once
	dnsErr  error
	// flanneld's rights, given with the first node (Options.Flannel).
	flannelOnce sync.Once
	flannelErr  error
	// kube-network-policies' rights, given with the first node
	// (Options.NetworkPolicy).
	networkPolicyOnce sync.Once
	networkPolicyErr  error

	schedulerMu sync.Mutex

	// apiserverArgs start the API server again (RestartAPIServer).
	apiserverArgs []string

	Etcd, APIServer, ControllerManager, Scheduler *Process
}

// ControlPlanes starts n control planes concurrently, named cp1..cpN.
func (e *Env) ControlPlanes(n int, opts ControlPlaneOptions) []*ControlPlane {
	e.t.Helper()
	each := make([]ControlPlaneOptions, n)
	for i := range each {
		each[i] = opts
	}
	return e.ControlPlanesEach(each...)
}

// ControlPlanesEach is ControlPlanes with options of its own for each
// control plane (a pod network per cluster, say).
func (e *Env) ControlPlanesEach(opts ...ControlPlaneOptions) []*ControlPlane {
	e.t.Helper()
	n := len(opts)
	if err := e.ensureInotifyRoom(n*controlPlaneInotify, fmt.Sprintf("%d control planes", n)); err != nil {
		e.fatalf("start control planes: %v", err)
	}
	cps := make([]*ControlPlane, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cps[i], errs[i] = e.startControlPlaneRetrying(fmt.Sprintf("cp%d", i+1), opts[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		e.fatalf("start control planes: %v", err)
	}
	return cps
}

// ControlPlane starts one control plane.
func (e *Env) ControlPlane(name string, opts ControlPlaneOptions) *ControlPlane {
	e.t.Helper()
	if err := e.ensureInotifyRoom(controlPlaneInotify, "control plane "+name); err != nil {
		e.fatalf("start control plane %s: %v", name, err)
	}
	cp, err := e.startControlPlaneRetrying(name, opts)
	if err != nil {
		e.fatalf("start control plane %s: %v", name, err)
	}
	return cp
}

// startControlPlaneRetrying starts a control plane and, should a port it
// drew be taken before its server bound it (another test's server drew
// it too), stops it and starts again on new ports.
func (e *Env) startControlPlaneRetrying(name string, opts ControlPlaneOptions) (*ControlPlane, error) {
	if err := checkName("control plane", name); err != nil {
		return nil, err
	}
	// The LAN address outlives the attempts: the certificates of each
	// attempt name it.
	var front *apiFront
	if opts.LAN != nil {
		var err error
		if front, err = e.newAPIFront(name, opts.LAN); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		var cp *ControlPlane
		cp, err = e.startControlPlane(name, opts, front)
		if err == nil && front != nil {
			err = front.serve(cp.Addr)
		}
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			return cp, err
		}
		if cp != nil {
			cp.Stop()
		}
		os.RemoveAll(filepath.Join(e.Dir, name)) // etcd must not reuse the data of the failed attempt
		e.t.Logf("harness: %s: a port was taken while starting (attempt %d), retrying on new ports", name, attempt)
	}
	return nil, err
}

func (e *Env) startControlPlane(name string, opts ControlPlaneOptions, front *apiFront) (*ControlPlane, error) {
	if !opts.ServiceCIDR.IsValid() {
		opts.ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	}
	dir := filepath.Join(e.Dir, name)
	var lanAddr netip.Addr
	if front != nil {
		lanAddr = front.addr
	}
	p, err := newPKI(filepath.Join(dir, "pki"), lanAddr)
	if err != nil {
		return nil, fmt.Errorf("%s: certificates: %w", name, err)
	}
	cp := &ControlPlane{Name: name, Options: opts, LANAddr: lanAddr, env: e, dir: dir, pki: p}
	ports, err := freePorts(4)
	if err != nil {
		return cp, err
	}
	etcdClient, etcdPeer, apiPort, kcmPort := ports[0], ports[1], ports[2], ports[3]
	cp.Addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(apiPort))
	if err := cp.writeKubeconfig(); err != nil {
		return cp, err
	}

	if cp.egress, err = e.newEgressProxy(dir); err != nil {
		return cp, err
	}
	egressConfig, err := cp.egress.configFile(dir)
	if err != nil {
		return cp, err
	}

	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	cp.Etcd, err = e.start(name+"-etcd", nil, []string{
		"etcd", "--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default=" + peerURL, "--log-level", "warn",
	})
	if err != nil {
		return cp, fmt.Errorf("%s: start etcd: %w", name, err)
	}
	cp.Etcd.quiet = true
	bin := func(b string) string { return filepath.Join(KubeBinDir(), b) }
	apiserverArgs := []string{
		bin("kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort),
		"--tls-cert-file", p.servingCert, "--tls-private-key-file", p.servingKey,
		"--client-ca-file", p.caCert,
		"--service-account-issuer", serviceAccountIssuer,
		// The issuer first: pods' own tokens carry it. Then the audience
		// of the tokens a provider grants its consumers
		// (offload.DefaultAudience; harness_test checks they agree).
		"--api-audiences", serviceAccountIssuer + "," + OffloadAudience,
		"--service-account-key-file", p.saPub, "--service-account-signing-key-file", p.saKey,
		"--service-cluster-ip-range", opts.ServiceCIDR.String(),
		"--authorization-mode", "Node,RBAC",
		"--allow-privileged=true",
		// Loopback cannot be an endpoint of the kubernetes Service.
		"--endpoint-reconciler-type", "none",
		"--enable-priority-and-fairness=false",
		// Real nodes: the API server reaches kubelets by their node
		// address (node names do not resolve), with a client certificate,
		// through the egress proxy into the node's network namespace.
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		"--kubelet-client-certificate", p.kubeletClientCert, "--kubelet-client-key", p.kubeletClientKey,
		"--egress-selector-config-file", egressConfig,
		// Admission webhooks get a client certificate
		// (WebhookClientName), so a webhook can require it.
		"--admission-control-config-file", p.admissionConfig,
		"--profiling=false",
		"--cert-dir", filepath.Join(dir, "apiserver"),
		"-v", "1",
	}
	if len(opts.KubeletCA) > 0 {
		path, err := p.write("kubelet-ca.crt", opts.KubeletCA)
		if err != nil {
			return cp, err
		}
		apiserverArgs = append(apiserverArgs, "--kubelet-certificate-authority", path)
	}
	cp.apiserverArgs = apiserverArgs
	cp.APIServer, err = e.start(name+"-apiserver", nil, apiserverArgs)
	if err != nil {
		return cp, fmt.Errorf("%s: start kube-apiserver: %w", name, err)
	}
	cp.APIServer.quiet = true
	e.t.Cleanup(func() { cp.APIServer.Stop() }) // before etcd stops: registered later, runs earlier
	if err := cp.waitReady(90 * time.Second); err != nil {
		return cp, fmt.Errorf("%s: %w\nlast lines of kube-apiserver:\n%s\nlast lines of etcd:\n%s", name, err, cp.APIServer.Tail(15), cp.Etcd.Tail(5))
	}
	kcmArgs := []string{
		bin("kube-controller-manager"),
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig, "--authorization-kubeconfig", cp.Kubeconfig,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(kcmPort),
		"--leader-elect=false",
		"--controllers", "*",
		"--service-account-private-key-file", p.saKey, "--root-ca-file", p.caCert,
		"--cluster-signing-cert-file", p.caCert, "--cluster-signing-key-file", p.caKey,
		"--service-cluster-ip-range", opts.ServiceCIDR.String(),
		"--cert-dir", filepath.Join(dir, "controller-manager"),
		"-v", "1",
	}
	kcmArgs = append(kcmArgs, clientQPSArgs(opts.ClientQPS)...)
	if opts.PodCIDR.IsValid() && !opts.NoNodeCIDRs {
		kcmArgs = append(kcmArgs, "--allocate-node-cidrs=true", "--cluster-cidr", opts.PodCIDR.String(),
			"--node-cidr-mask-size", strconv.Itoa(nodeMaskSize(opts.PodCIDR)))
	}
	if cp.ControllerManager, err = e.start(name+"-controller-manager", nil, kcmArgs); err != nil {
		return cp, fmt.Errorf("%s: start kube-controller-manager: %w", name, err)
	}
	cp.ControllerManager.quiet = true
	if err := cp.waitControllers(90 * time.Second); err != nil {
		return cp, fmt.Errorf("%s: %w\nlast lines of kube-controller-manager:\n%s", name, err, cp.ControllerManager.Tail(15))
	}
	if opts.Scheduler {
		if err := cp.startScheduler(); err != nil {
			return cp, err
		}
	}
	return cp, nil
}

// Stop stops the control plane's processes, newest first. The test's
// cleanup does the same; Stop is for tests that need it gone earlier.
func (cp *ControlPlane) Stop() {
	for _, p := range []*Process{cp.Scheduler, cp.ControllerManager, cp.APIServer, cp.Etcd} {
		if p != nil {
			p.Stop()
		}
	}
}

// StopAPIServer stops the API server alone (SIGTERM), as an upgrade or a
// crash of a real control plane takes it away: etcd and the controller
// manager stay, and clients see connections refused until
// StartAPIServer.
func (cp *ControlPlane) StopAPIServer() {
	// Its exit status says nothing here: it is gone either way.
	_ = cp.APIServer.Stop()
}

// StartAPIServer starts the API server stopped by StopAPIServer again,
// on the same port, etcd and certificates, and waits until it serves.
func (cp *ControlPlane) StartAPIServer() error {
	if exited, _ := cp.APIServer.Exited(); !exited {
		return fmt.Errorf("%s: kube-apiserver is still running", cp.Name)
	}
	p, err := cp.env.start(cp.Name+"-apiserver", nil, cp.apiserverArgs)
	if err != nil {
		return fmt.Errorf("%s: start kube-apiserver again: %w", cp.Name, err)
	}
	p.quiet = true
	cp.APIServer = p
	if err := cp.waitReady(90 * time.Second); err != nil {
		return fmt.Errorf("%s: kube-apiserver started again: %w\nlast lines:\n%s", cp.Name, err, p.Tail(15))
	}
	return nil
}

// StartScheduler starts kube-scheduler if it is not running yet.
func (cp *ControlPlane) StartScheduler() {
	cp.env.t.Helper()
	if err := cp.startScheduler(); err != nil {
		cp.env.fatalf("%v", err)
	}
}

func (cp *ControlPlane) startScheduler() error {
	cp.schedulerMu.Lock() // nodes starting at once all ask for it
	defer cp.schedulerMu.Unlock()
	if cp.Scheduler != nil {
		return nil
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	cp.Scheduler, err = cp.env.start(cp.Name+"-scheduler", nil, append([]string{
		filepath.Join(KubeBinDir(), "kube-scheduler"),
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig, "--authorization-kubeconfig", cp.Kubeconfig,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[0]),
		"--leader-elect=false", "-v", "1",
	}, clientQPSArgs(cp.Options.ClientQPS)...))
	if err != nil {
		return fmt.Errorf("%s: start kube-scheduler: %w", cp.Name, err)
	}
	cp.Scheduler.quiet = true
	return nil
}

// clientQPSArgs set a controller's client-side limit to qps (none when
// zero: the controller's own default).
func clientQPSArgs(qps int) []string {
	if qps <= 0 {
		return nil
	}
	return []string{"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(2 * qps)}
}

// nodeMaskSize picks the per-node pod range: a /24 for IPv4 (or the whole
// CIDR if it is smaller), a /64 for IPv6.
func nodeMaskSize(cidr netip.Prefix) int {
	want := 24
	if cidr.Addr().Is6() {
		want = 64
	}
	return max(want, cidr.Bits())
}

func (cp *ControlPlane) writeKubeconfig() error {
	host := "https://" + cp.Addr.String()
	cp.Config = &rest.Config{
		Host: host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: cp.pki.caPEM, CertData: cp.pki.adminCertPEM, KeyData: cp.pki.adminKeyPEM,
		},
		QPS: 200, Burst: 400,
	}
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	cp.Client = client
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cp.Name] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.pki.adminCertPEM, ClientKeyData: cp.pki.adminKeyPEM}
	cfg.Contexts[cp.Name] = &clientcmdapi.Context{Cluster: cp.Name, AuthInfo: "admin"}
	cfg.CurrentContext = cp.Name
	cp.Kubeconfig = filepath.Join(cp.dir, "kubeconfig")
	return clientcmd.WriteToFile(*cfg, cp.Kubeconfig)
}

// waitReady waits until the API server answers /readyz.
func (cp *ControlPlane) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		if exited, err := cp.APIServer.Exited(); exited {
			return fmt.Errorf("kube-apiserver exited: %v", err)
		}
		if exited, err := cp.Etcd.Exited(); exited {
			return fmt.Errorf("etcd exited: %v", err)
		}
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %s: %v", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitControllers waits until the controller manager works: the default
// ServiceAccount exists (pods cannot be created before).
func (cp *ControlPlane) waitControllers(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		if exited, err := cp.ControllerManager.Exited(); exited {
			return fmt.Errorf("kube-controller-manager exited: %v", err)
		}
		_, err := cp.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			cp.env.t.Logf("harness: %s: waiting for the controller manager: %v", cp.Name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-controller-manager did not create the default ServiceAccount within %s", timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ExposeTo makes the API server reachable from inside netns n at the same
// address (127.0.0.1:port), so the same kubeconfig works there, e.g. for an
// agent running in a site.
func (cp *ControlPlane) ExposeTo(n *Netns) {
	cp.env.t.Helper()
	if err := n.forwardFromHost(cp.Addr); err != nil {
		cp.env.fatalf("expose %s to %s: %v", cp.Name, n.Name, err)
	}
}

// ReachInto makes the API server's connections to addresses in prefix
// (webhooks it calls by URL, kubelets) go into netns n, as on a network
// where it reaches them: an agent running in a site serves its admission
// webhook at the site's address. Nodes' addresses are routed so already.
func (cp *ControlPlane) ReachInto(n *Netns, prefix netip.Prefix) {
	cp.egress.route(prefix, n)
}

// freePorts returns n TCP ports that were free on loopback a moment ago,
// drawn below the kernel's ephemeral range (net.ipv4.ip_local_port_range),
// so outgoing connections cannot take one before its server binds it, as
// they can with ports the kernel hands out for ":0".
func freePorts(n int) ([]int, error) {
	low := ephemeralLow()
	const floor = 10000
	if low-floor < 1000 {
		return nil, fmt.Errorf("find free ports: the ephemeral range starts at %d, too low to draw from below it", low)
	}
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, errors.New("find free ports: none free below the ephemeral range")
		}
		port := floor + mrand.IntN(low-floor)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		ls = append(ls, l) // held until all are found: no duplicates
		ports = append(ports, port)
	}
	return ports, nil
}

// ephemeralLow is the first port the kernel hands out for outgoing
// connections (32768 unless configured).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil {
				return low
			}
		}
	}
	return 32768
}

// WriteFile writes data to a file in the run directory and returns its path.
func (e *Env) WriteFile(name string, data []byte) string {
	e.t.Helper()
	path := filepath.Join(e.Dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		e.fatalf("%v", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		e.fatalf("%v", err)
	}
	return path
}
