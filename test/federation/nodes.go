package federation

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

const (
	// AgentNamespace is where deploy/ installs the agent.
	AgentNamespace = "flotilla-system"
	// AgentSelector selects the agent's pod.
	AgentSelector = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"
	// WebPod is the test server pod on each gateway node, in "default".
	WebPod = "web"
)

// NodeCluster is a cluster of real nodes: a control plane, its gateway
// node and worker nodes, the agent installed from deploy/ as a pod of its
// own image (by OnNodes, or by InstallAgent for a cluster in
// NodeOptions.Later), and a test server pod (WebPod) on the gateway node.
// Its Cluster has no Site, Pod or Agent process.
type NodeCluster struct {
	*Cluster
	// Gateway is the first gateway candidate: the node the agent runs on
	// where there is one candidate.
	Gateway *harness.Node
	// Candidates are the nodes labelled flotilla.io/gateway=true,
	// Gateway first (NodeOptions.CandidatesOf); with more than one the
	// agent runs as deploy/ has it, two replicas with --leader-elect,
	// and ActiveAgent finds the one that holds the Lease.
	Candidates []*harness.Node
	// Workers are the cluster's other nodes (NodeOptions.Workers), on the
	// same LAN as every gateway.
	Workers []*harness.Node
	// Web is the test server pod on the gateway node, once Ready.
	Web corev1.Pod
	// Install is the directory of the kustomization applied: deploy/ as
	// its base and the cluster's settings.
	Install string

	env        *harness.Env
	settings   agentSettings // the agent's, as last installed
	lan        *harness.LAN
	images     []string // the agent's image tarball and NodeOptions.Images, imported into every node
	masquerade harness.Masquerade
	// nodeCIDR gives node k its CNI range where the control plane
	// allocates none (NodeOptions.NodeCIDRsOf); nil otherwise.
	nodeCIDR func(k int) netip.Prefix
}

// AddWorkers starts more worker nodes of c at once, like the others (on
// the LAN, with the agent's image and the CNI's masquerade), and returns
// them once Ready.
func (c *NodeCluster) AddWorkers(t harness.TB, names ...string) []*harness.Node {
	t.Helper()
	nodes := c.addNodes(t, "worker", names)
	c.Workers = append(c.Workers, nodes...)
	return nodes
}

// AddCandidates starts more gateway-candidate nodes of c at once, like
// AddWorkers, labelled flotilla.io/gateway=true, where the agent's
// Deployment may place a replica.
func (c *NodeCluster) AddCandidates(t harness.TB, names ...string) []*harness.Node {
	t.Helper()
	nodes := c.addNodes(t, "gateway", names)
	for _, n := range nodes {
		mustKubectl(t, c.CP, "label", "node", n.NodeName, "flotilla.io/gateway=true")
	}
	c.Candidates = append(c.Candidates, nodes...)
	return nodes
}

func (c *NodeCluster) addNodes(t harness.TB, role string, names []string) []*harness.Node {
	t.Helper()
	var specs []harness.NodeSpec
	for j, name := range names {
		opts := harness.NodeOptions{Network: c.lan, Role: role, Images: c.images}
		if c.nodeCIDR != nil {
			opts.PodCIDR = c.nodeCIDR(len(c.Candidates) + len(c.Workers) + j)
		}
		specs = append(specs, harness.NodeSpec{CP: c.CP, Name: name, Options: opts})
	}
	nodes := c.env.StartNodes(specs...)
	for _, n := range nodes {
		if err := n.InstallMasquerade(c.masquerade); err != nil {
			t.Fatalf("cluster %s: %v", c.Name, err)
		}
	}
	return nodes
}

// LAN is the network c's nodes are on, where more sites may join them:
// the one every cluster of OnNodes shares, or the cluster's own behind
// its NAT router (NodeOptions.BehindNAT).
func (c *NodeCluster) LAN() *harness.LAN { return c.lan }

// FederationToken is the join token c's agent was installed with, the
// same for every cluster of OnNodes but those of NodeOptions.Keyless
// (empty).
func (c *NodeCluster) FederationToken() string { return c.settings.token }

// NodeOptions configure OnNodes.
type NodeOptions struct {
	// Clusters is how many; each gets its own control plane.
	Clusters int
	// PodCIDR is every cluster's pod network: the same on purpose, to
	// show that overlaps are remapped.
	PodCIDR netip.Prefix
	// PodCIDRs, when set, are the clusters' pod networks, one per cluster
	// (overriding PodCIDR): a /8 gives each node a /24 of it.
	PodCIDRs []netip.Prefix
	// Workers is how many worker nodes (role "worker") each cluster has
	// besides its gateway node. A harness node sits on one network, so
	// they share the gateways' LAN: every node of every cluster is on it.
	Workers int
	// WorkersOf, when set, is how many worker nodes each cluster has, one
	// count per cluster (overriding Workers).
	WorkersOf []int
	// Masquerade is a CNI's masquerade rules, installed on every node of
	// every cluster before the agent is; zero: none.
	Masquerade harness.Masquerade
	// Flannel makes flannel every cluster's CNI (harness
	// ControlPlaneOptions.Flannel): flanneld on every node, VXLAN between
	// a cluster's nodes and flannel's own masquerade.
	Flannel bool
	// NetworkPolicy makes every cluster enforce NetworkPolicy (harness
	// ControlPlaneOptions.NetworkPolicy): kube-network-policies on every
	// node.
	NetworkPolicy bool
	// NodeCIDRsOf, when set and valid for cluster i's gateway (node 0),
	// gives that cluster's nodes their CNI range directly (node k:
	// workers from 1): its controller manager allocates none, and its
	// Nodes have no spec.podCIDRs, as with a CNI that has its own IPAM.
	NodeCIDRsOf func(cluster, node int) netip.Prefix
	// ArgsFor, when set, gives cluster i's agent more arguments.
	ArgsFor func(i int) []string
	// ClientQPS, when set, is the client-side limit of every cluster's
	// controller manager and scheduler (ControlPlaneOptions.ClientQPS).
	ClientQPS int
	// Later lists clusters (by index) whose agent OnNodes does not
	// install: the test installs it with InstallAgent, as a cluster that
	// joins the federation after the others.
	Later []int
	// Images are more image tarballs imported into every node of every
	// cluster (AddWorkers' too), for pods that run without a registry.
	Images []string
	// CandidatesOf, when set, is how many gateway-candidate nodes each
	// cluster has (default 1), one count per cluster: nodes "gw",
	// "gw2"... labelled flotilla.io/gateway=true. A cluster with more
	// than one runs two agent replicas with --leader-elect, each with
	// the state directory of its own node, advertising its node's
	// address.
	CandidatesOf []int
	// BehindNAT lists clusters (by index) whose nodes sit on a LAN of
	// their own behind a NAT router on the shared LAN
	// (harness.NewLANBehind, the cluster's NAT): they reach the shared
	// LAN as the router's address, and nobody on it reaches them first.
	// The cluster's API server stays on the shared LAN.
	BehindNAT []int
	// Keyless lists clusters (by index) whose agent is installed without
	// a federation key, as deploy/ alone installs it: it generates its
	// own and federates with nobody until it joins (`flotilla join`).
	Keyless []int
}

// OnNodes starts opts.Clusters clusters of real nodes: per cluster a
// control plane, a gateway node and opts.Workers worker nodes (every node
// of every cluster started at once) on one shared LAN, with the agent's image built from this checkout
// imported into every node; installs opts.Masquerade on every node; installs
// each cluster's agent with `kubectl apply --server-side -k` of deploy/
// plus only the cluster's settings; and runs a test server pod on each
// gateway node. It returns once the agent pods and the test server pods
// are Ready, and so is each cluster's DNS (the harness's CoreDNS);
// WaitPhases waits for the Peers. The clusters in opts.Later
// get everything but their agent.
func OnNodes(t harness.TB, env *harness.Env, opts NodeOptions) []*NodeCluster {
	t.Helper()
	start := time.Now()
	tag := "flotilla.local/flotilla:test-" + env.RunID
	image := harness.FlotillaImage(t, tag)
	imaged := time.Now()
	lan := env.NewLAN("lan")
	token := federationToken(t)
	var cs []*NodeCluster
	cidrs, workers, candidates := make([]netip.Prefix, opts.Clusters), make([]int, opts.Clusters), make([]int, opts.Clusters)
	cpOpts := make([]harness.ControlPlaneOptions, opts.Clusters)
	for i := range opts.Clusters {
		cidrs[i], workers[i] = opts.PodCIDR, opts.Workers
		if opts.PodCIDRs != nil {
			cidrs[i] = opts.PodCIDRs[i]
		}
		if opts.WorkersOf != nil {
			workers[i] = opts.WorkersOf[i]
		}
		candidates[i] = 1
		if opts.CandidatesOf != nil {
			candidates[i] = max(1, opts.CandidatesOf[i])
		}
		// The API server on the nodes' LAN too, as other clusters reach it.
		cpOpts[i] = harness.ControlPlaneOptions{PodCIDR: cidrs[i], LAN: lan, ClientQPS: opts.ClientQPS, Flannel: opts.Flannel,
			NetworkPolicy: opts.NetworkPolicy,
			NoNodeCIDRs:   opts.NodeCIDRsOf != nil && opts.NodeCIDRsOf(i, 0).IsValid()}
	}
	nodeCIDR := func(i, k int) netip.Prefix {
		if !cpOpts[i].NoNodeCIDRs {
			return netip.Prefix{}
		}
		return opts.NodeCIDRsOf(i, k)
	}
	cps := env.ControlPlanesEach(cpOpts...)
	cpsUp := time.Now()
	publishClusterInfo(t, cps)
	// Every node of every cluster at once: most of a node's start is
	// waiting (for its kubelet to register, for its pod range).
	var specs []harness.NodeSpec
	first := make([]int, opts.Clusters+1) // cluster i's nodes are nodes[first[i]:first[i+1]], its candidates first
	nets := make([]*harness.LAN, opts.Clusters)
	nats := make([]*harness.NATRouter, opts.Clusters)
	for i := range opts.Clusters {
		nets[i] = lan
		if slices.Contains(opts.BehindNAT, i) {
			name := string(rune('a' + i))
			nats[i] = env.NewNATRouter("nat"+name, lan)
			nets[i] = env.NewLANBehind("natlan"+name, nats[i])
		}
	}
	for i, cp := range cps {
		first[i] = len(specs)
		node := harness.NodeOptions{Network: nets[i], Role: "gateway", Images: append([]string{image}, opts.Images...)}
		for g := range candidates[i] {
			name := "gw"
			if g > 0 {
				name = fmt.Sprintf("gw%d", g+1)
			}
			node.PodCIDR = nodeCIDR(i, g)
			specs = append(specs, harness.NodeSpec{CP: cp, Name: name, Options: node})
		}
		node.Role = "worker"
		for w := range workers[i] {
			node.PodCIDR = nodeCIDR(i, candidates[i]+w)
			specs = append(specs, harness.NodeSpec{CP: cp, Name: fmt.Sprintf("w%d", w+1), Options: node})
		}
	}
	first[opts.Clusters] = len(specs)
	nodesFrom := time.Now()
	nodes := env.StartNodes(specs...)
	nodesUp := time.Now()
	for i, cp := range cps {
		name := string(rune('a' + i))
		c, err := client.New(cp.Config, client.Options{Scheme: peerapi.Scheme()})
		if err != nil {
			t.Fatalf("client of %s: %v", name, err)
		}
		nc := &NodeCluster{
			Cluster: &Cluster{Name: name, CP: cp, NAT: nats[i], Client: c, iface: env.LinkName(name),
				StateDir:     filepath.Join(env.Dir, "state-"+name),
				APIServerURL: cp.LANURL(), APIServerCA: cp.CAFile()},
			Gateway: nodes[first[i]],
			// Copies: AddWorkers and AddCandidates append to these, which
			// must not write over the next cluster's nodes in nodes.
			Candidates: slices.Clone(nodes[first[i] : first[i]+candidates[i]]),
			Workers:    slices.Clone(nodes[first[i]+candidates[i] : first[i+1]]),
			env:        env, lan: nets[i], images: append([]string{image}, opts.Images...), masquerade: opts.Masquerade,
			settings: agentSettings{image: tag, podCIDR: cidrs[i], token: token, args: argsFor(opts, i)},
		}
		if slices.Contains(opts.Keyless, i) {
			nc.settings.token = ""
		}
		if cpOpts[i].NoNodeCIDRs {
			nc.nodeCIDR = func(k int) netip.Prefix { return nodeCIDR(i, k) }
		}
		for _, n := range nc.Candidates {
			mustKubectl(t, cp, "label", "node", n.NodeName, "flotilla.io/gateway=true")
		}
		for _, n := range nodes[first[i]:first[i+1]] {
			if err := n.InstallMasquerade(opts.Masquerade); err != nil {
				t.Fatalf("cluster %s: %v", name, err)
			}
		}
		if !slices.Contains(opts.Later, i) {
			nc.Install = writeKustomization(t, env, nc, nc.settings)
			mustKubectl(t, cp, "apply", "--server-side", "-k", nc.Install)
		}
		cs = append(cs, nc)
	}
	// Run before the nodes and control planes stop (cleanups run last
	// first), and before a node AddWorkers started later stops: no test
	// can forget to check what the agents leave, and every node of the
	// clusters is still running while the agents are uninstalled.
	// A sync.Once, not sync.OnceFunc: checkUninstall fails with t.Fatal,
	// whose Goexit OnceFunc turns into a panic that would end every test
	// of the package running beside this one.
	var once sync.Once
	check := func() { once.Do(func() { checkUninstall(t, cs) }) }
	t.Cleanup(check)
	env.BeforeNodesStop(check)
	t.Logf("control planes, nodes and kubectl apply -k: %s (image %s, control planes %s, nodes %s, labels and install %s)", time.Since(start).Round(time.Millisecond),
		imaged.Sub(start).Round(time.Millisecond), cpsUp.Sub(imaged).Round(time.Millisecond), nodesUp.Sub(nodesFrom).Round(time.Millisecond), time.Since(nodesUp).Round(time.Millisecond))
	for _, c := range cs {
		c.createWeb(t, c.Gateway, WebPod)
	}
	for i, c := range cs {
		c.CP.WaitDNS(t)
		c.Web = c.waitWeb(t, c.Gateway, WebPod)
		if !slices.Contains(opts.Later, i) {
			c.waitAgents(t)
		}
	}
	t.Logf("agent and test server pods Ready: %s", time.Since(start).Round(time.Millisecond))
	return cs
}

// InstallAgent installs c's agent from deploy/ with the cluster's settings
// and args (nil: none) as its further arguments, in place of those it was
// installed with, if any (its Deployment recreates the pod), and returns
// once the new agent pod is Ready.
func (c *NodeCluster) InstallAgent(t harness.TB, args []string) {
	t.Helper()
	old, _ := c.AgentPod(context.Background()) // none yet: no UID
	c.settings.args = args
	c.Install = writeKustomization(t, c.env, c, c.settings)
	mustKubectl(t, c.CP, "apply", "--server-side", "-k", c.Install)
	if c.replicated() {
		c.waitAgents(t)
		return
	}
	waitPod(t, c.Gateway, "new agent pod of "+c.Name+" Ready", func(ctx context.Context) (corev1.Pod, error) {
		p, err := c.AgentPod(ctx)
		if err == nil && old.UID != "" && p.UID == old.UID {
			return p, fmt.Errorf("agent pod %s not replaced yet", p.Name)
		}
		return p, err
	})
}

// Clusters returns the Clusters of cs, for WaitPhases and ViewOf.
func Clusters(cs []*NodeCluster) []*Cluster {
	out := make([]*Cluster, len(cs))
	for i, c := range cs {
		out[i] = c.Cluster
	}
	return out
}

func federationToken(t harness.TB) string {
	key, err := discovery.GenerateFederationKey()
	if err != nil {
		t.Fatalf("%v", err)
	}
	token, err := discovery.JoinToken{Key: key}.Encode()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return token
}

// agentSettings are what differs from deploy/ in one test cluster.
type agentSettings struct {
	image, token string
	podCIDR      netip.Prefix
	args         []string
}

func argsFor(opts NodeOptions, i int) []string {
	if opts.ArgsFor == nil {
		return nil
	}
	return opts.ArgsFor(i)
}

// writeKustomization writes a kustomization that installs deploy/
// unchanged but for the cluster's settings, and returns its directory.
func writeKustomization(t harness.TB, env *harness.Env, c *NodeCluster, s agentSettings) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(self), "..", "..", "deploy")
	dir := filepath.Join(env.Dir, "install-"+c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	base, err := filepath.Rel(dir, deploy)
	if err != nil {
		t.Fatalf("%v", err)
	}
	name, version, _ := strings.Cut(s.image, ":")
	// The federation key, unless the cluster is keyless.
	keySecret, keyArg, keyMount, keyVolume := `secretGenerator:
- name: flotilla-federation
  namespace: flotilla-system
  files:
  - token
  options:
    disableNameSuffixHash: true
`, `
        - --federation-key-file=/etc/flotilla/token`, `
        volumeMounts:
        - name: federation
          mountPath: /etc/flotilla
          readOnly: true`, `
      - name: federation
        secret:
          secretName: flotilla-federation`
	if s.token == "" {
		keySecret, keyArg, keyMount, keyVolume = "", "", "", ""
	}
	files := map[string]string{
		"token": s.token,
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: ghcr.io/flotilla-io/flotilla
  newName: %s
  newTag: %s
%spatches:
- path: agent.yaml
`, base, name, version, keySecret),
		// The cluster's settings, and what the test machine needs:
		//   - the API server: the harness has no endpoints for the
		//     kubernetes Service (loopback cannot be one), but relays
		//     127.0.0.1:<port> into every node's namespace, which a
		//     hostNetwork pod shares; in-cluster configuration reads
		//     KUBERNETES_SERVICE_HOST and _PORT;
		//   - the state directory: /var/lib/flotilla would be one
		//     directory for every gateway node of this machine;
		//   - the WireGuard interface: wireguard-go's control socket in
		//     /run/wireguard is host-wide, so its name must be unique;
		//     two replicas of one cluster, whose interfaces have the same
		//     name, each get a directory of their own there
		//     (agentPatch);
		//   - one gateway node, so one replica without leader election
		//     (docs/ha.md, "One replica"), unless the cluster has more
		//     gateway candidates (agentPatch).
		// The placement webhook keeps its default: only the API
		// server's client certificate (harness.WebhookClientName), signed
		// by the cluster's client CA.
		"agent.yaml": agentPatch(c, s, keyArg, keyMount, keyVolume),
	}
	for file, content := range files {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatalf("%v", err)
		}
	}
	return dir
}

// agentPatch is the agent Deployment's patch of c's settings. With one
// gateway candidate: one replica without leader election, advertising
// the gateway's address. With more: deploy/'s two replicas, its
// --leader-elect and rolling update, each replica advertising its own
// node's address ($(HOST_IP)) and keeping its ledger in a directory of
// its own node ($(NODE_NAME) under the cluster's state directory: the
// nodes of this machine share one file system, a real cluster's do not),
// and its WireGuard control socket too (harness.WireGuardSocketDir):
// otherwise a replica could configure, or remove, the other's device.
func agentPatch(c *NodeCluster, s agentSettings, keyArg, keyMount, keyVolume string) string {
	replicas, strategy, advertise, elect, hostIP, subPath := "1", `
  strategy:
    type: Recreate
    rollingUpdate: null`, c.Gateway.Addr.String(), "", "", ""
	if c.replicated() {
		// The patch's args replace deploy/'s: --leader-elect again.
		replicas, strategy, advertise, elect = "2", "", "$(HOST_IP)", `
        - --leader-elect`
		hostIP = `
        - name: HOST_IP
          valueFrom:
            fieldRef:
              fieldPath: status.hostIP`
		subPath = `
        - name: state
          mountPath: /var/lib/flotilla
          subPathExpr: $(NODE_NAME)
        - name: wireguard-sockets
          mountPath: /var/run/wireguard
          subPathExpr: ` + harness.WireGuardSocketDir(c.iface, "$(NODE_NAME)")
		if keyMount == "" {
			subPath = `
        volumeMounts:` + subPath
		}
	}
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: flotilla-agent
  namespace: flotilla-system
spec:
  replicas: %s%s
  template:
    spec:
      containers:
      - name: agent
        imagePullPolicy: Never
        args:
        - agent
        - --state-dir=/var/lib/flotilla
        - --log-format=json
        - --cluster-name=%s
        - --pod-cidr=%s
        - --advertise-addr=%s
        - --wireguard-interface=%s%s
        - --fabric-owner=flotilla-agent%s%s
        env:
        - name: KUBERNETES_SERVICE_HOST
          value: "127.0.0.1"
        - name: KUBERNETES_SERVICE_PORT
          value: "%d"%s%s%s
      volumes:
      - name: state
        hostPath:
          path: %s
          type: DirectoryOrCreate%s
`, replicas, strategy, c.Name, s.podCIDR, advertise, c.iface, keyArg, elect, extraArgs(s.args), c.CP.Addr.Port(), hostIP, keyMount, subPath, c.StateDir, keyVolume)
}

// replicated reports whether c runs two agent replicas with leader
// election: it has more than one gateway candidate.
func (c *NodeCluster) replicated() bool { return len(c.Candidates) > 1 }

// extraArgs renders args as more items of the container's args list.
func extraArgs(args []string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteString("\n        - " + strconv.Quote(a))
	}
	return b.String()
}

// RunWeb runs a test server pod (TestServerImage) named name in
// "default" on node, one of c's nodes, and returns it once Ready.
func RunWeb(t harness.TB, c *NodeCluster, node *harness.Node, name string) corev1.Pod {
	t.Helper()
	c.createWeb(t, node, name)
	return c.waitWeb(t, node, name)
}

// createWeb creates a test server pod on node.
func (c *NodeCluster) createWeb(t harness.TB, node *harness.Node, name string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      node.NodeName,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "server", Image: harness.TestServerImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{harness.TestServerUID},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(harness.TestServerTCPPort)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
	if _, err := c.CP.Client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s in %s: %v", name, c.Name, err)
	}
}

// waitWeb waits until the test server pod name on node is Ready.
func (c *NodeCluster) waitWeb(t harness.TB, node *harness.Node, name string) corev1.Pod {
	t.Helper()
	return waitPod(t, node, "pod "+name+" of "+c.Name+" Ready", func(ctx context.Context) (corev1.Pod, error) {
		p, err := c.CP.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return corev1.Pod{}, err
		}
		return *p, nil
	})
}

// AgentPod returns the agent's pod; an error says why it is not (yet) a
// Ready pod on the gateway node that never restarted.
func (c *NodeCluster) AgentPod(ctx context.Context) (corev1.Pod, error) {
	pods, err := c.CP.Client.CoreV1().Pods(AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector})
	if err != nil {
		return corev1.Pod{}, err
	}
	if len(pods.Items) != 1 {
		return corev1.Pod{}, fmt.Errorf("%d agent pods", len(pods.Items))
	}
	p := pods.Items[0]
	if p.Spec.NodeName != c.Gateway.NodeName {
		return p, fmt.Errorf("agent pod %s on node %q, want %s", p.Name, p.Spec.NodeName, c.Gateway.NodeName)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			return p, fmt.Errorf("agent container restarted %d times (last: %+v); the last lines it wrote before:\n%s",
				s.RestartCount, s.LastTerminationState.Terminated, c.previousLogs(ctx, p))
		}
	}
	return p, PodReady(p)
}

// previousLogs is the tail of what the agent's previous container wrote
// (kubectl logs --previous), or why it cannot be read.
func (c *NodeCluster) previousLogs(ctx context.Context, p corev1.Pod) string {
	tail := int64(15)
	b, err := c.CP.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Previous: true, TailLines: &tail}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(kubectl logs --previous: %v)", err)
	}
	return string(b)
}

// PodReady says why p is not Ready, or nil.
func PodReady(p corev1.Pod) error {
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			return fmt.Errorf("pod %s: container %s waiting: %s: %s", p.Name, s.Name, w.Reason, w.Message)
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("pod %s %s, not Ready", p.Name, p.Status.Phase)
}

// waitPod polls get until its pod, on node, is Ready and returns it.
func waitPod(t harness.TB, node *harness.Node, what string, get func(context.Context) (corev1.Pod, error)) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		p, err := get(context.Background())
		if err == nil {
			err = PodReady(p)
		}
		if err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 90s: %v\nkubelet of node %s:\n%s", what, err, node.NodeName, tail(node.Logs("kubelet"), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Fetch makes from's test server pod GET / of to's at from's view of it,
// over HTTP through the tunnel, retrying for up to 30 s while the path
// comes up. Seen is the caller's address as to's pod reported it; Err
// also says when another pod answered (CheckAnswer) or that is not Want,
// to's view of from's pod.
func Fetch(t harness.TB, from, to *NodeCluster) Result {
	t.Helper()
	return FetchPods(t, from, from.Web, to, to.Web)
}

// FetchPods is Fetch between any two test server pods (RunWeb).
func FetchPods(t harness.TB, from *NodeCluster, fromPod corev1.Pod, to *NodeCluster, toPod corev1.Pod) Result {
	t.Helper()
	r := Result{
		From: from.Cluster, To: to.Cluster,
		Dst:  ViewOf(t, from.Cluster, to.Cluster, netip.MustParseAddr(toPod.Status.PodIP)),
		Want: ViewOf(t, to.Cluster, from.Cluster, netip.MustParseAddr(fromPod.Status.PodIP)),
	}
	// "/" answers the server's host name, its pod's UID and the caller's
	// address: the UID, not the Peers, says the right pod of the right
	// cluster answered.
	url := fmt.Sprintf("http://%s:%d/", r.Dst, harness.TestServerHTTPPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var answered bool
		r.Seen, answered, r.Err = getAnswer(from, fromPod, url, r.Want, to.Name, toPod)
		if answered || time.Now().After(deadline) {
			return r
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// GetAnswer has fromPod, a test server pod of c, GET url (its -get, by
// kubectl exec) and checks with CheckAnswer that one of pods of cluster
// to answered and saw the caller as want: for a URL that names no pod (a
// Service, a DNS name), pods are the ones that may answer.
func GetAnswer(c *NodeCluster, fromPod corev1.Pod, url string, want netip.Addr, to string, pods ...corev1.Pod) error {
	_, _, err := getAnswer(c, fromPod, url, want, to, pods...)
	return err
}

// getAnswer is GetAnswer that also returns the address the server saw
// the caller as, and whether anything answered (false: the exec or the
// GET failed, worth another try).
func getAnswer(c *NodeCluster, fromPod corev1.Pod, url string, want netip.Addr, to string, pods ...corev1.Pod) (netip.Addr, bool, error) {
	out, err := Kubectl(c.CP, "-n", fromPod.Namespace, "exec", fromPod.Name, "--", "/testserver", "-get", url)
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("GET %s from %s's pod %s: %w", url, c.Name, fromPod.Name, err)
	}
	seen, err := CheckAnswer(out, want, to, pods...)
	if err != nil {
		return seen, true, fmt.Errorf("GET %s from %s's pod %s: %w", url, c.Name, fromPod.Name, err)
	}
	return seen, true, nil
}

// Kubectl runs the pinned kubectl against cp and returns its output. It
// is killed after 2 minutes, a guard against a hang and not a bound: on a
// busy machine `apply -k` of the install (about 80 objects, CRDs among
// them) took longer than 30 s.
func Kubectl(cp *harness.ControlPlane, args ...string) (string, error) {
	return KubectlTimeout(cp, 2*time.Minute, args...)
}

// KubectlTimeout is Kubectl for commands that may take longer than 2 min.
func KubectlTimeout(cp *harness.ControlPlane, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := append([]string{"--kubeconfig", cp.Kubeconfig}, args...)
	out, err := exec.CommandContext(ctx, KubectlPath(), argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// KubectlPath is the pinned kubectl, as the harness built it.
func KubectlPath() string { return filepath.Join(harness.KubeBinDir(), "kubectl") }

func mustKubectl(t harness.TB, cp *harness.ControlPlane, args ...string) string {
	t.Helper()
	out, err := Kubectl(cp, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

// CheckAnswer reads the test server's answer at "/" and checks that it
// came from one of pods of cluster to (more than one: the pods behind a
// Service) and that it saw the caller as want. It returns the address
// the server saw the caller as.
func CheckAnswer(body string, want netip.Addr, to string, pods ...corev1.Pod) (netip.Addr, error) {
	a, err := ParseAnswer(body)
	if err != nil {
		return netip.Addr{}, err
	}
	if err := AnsweredBy(a, to, pods...); err != nil {
		return a.Seen, err
	}
	if a.Seen != want {
		return a.Seen, fmt.Errorf("%s's pod %s saw the caller as %s, want %s (its view of the caller)", to, a.Host, a.Seen, want)
	}
	return a.Seen, nil
}

// ParseAnswer reads the test server's answer at "/": its lines "host",
// "uid" and "peer".
func ParseAnswer(body string) (harness.Answer, error) {
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		k, v, _ := strings.Cut(line, " ")
		fields[k] = v
	}
	seen, err := netip.ParseAddr(fields["peer"])
	if fields["host"] == "" || fields["uid"] == "" || err != nil {
		return harness.Answer{}, fmt.Errorf("answer %q: want host, uid and peer", body)
	}
	return harness.Answer{Seen: seen, Host: fields["host"], UID: fields["uid"]}, nil
}

// AnsweredBy checks that a came from one of pods, as cluster to's API
// has them, by their UIDs: names and addresses repeat across clusters,
// so a view that looped back to the caller's own cluster could match
// them.
func AnsweredBy(a harness.Answer, to string, pods ...corev1.Pod) error {
	for _, p := range pods {
		if a.UID != "" && a.UID == string(p.UID) && a.Host == p.Name {
			return nil
		}
	}
	want := make([]string, len(pods))
	for i, p := range pods {
		want[i] = fmt.Sprintf("%s (uid %s)", p.Name, p.UID)
	}
	if len(pods) == 1 {
		return fmt.Errorf("answered by pod %s (uid %s), not %s's pod %s", a.Host, a.UID, to, want[0])
	}
	return fmt.Errorf("answered by pod %s (uid %s), not one of %s's pods %s", a.Host, a.UID, to, strings.Join(want, ", "))
}
