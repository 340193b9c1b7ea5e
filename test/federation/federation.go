// Package federation starts federations of real clusters for end-to-end
// tests and the demo. New: per cluster a control plane, a gateway site on
// a LAN or behind a router, a pod behind the site, and a flotilla agent
// process. OnNodes: per cluster a control plane and a real gateway node,
// the agent installed from deploy/ as a pod of its own image, and a test
// server pod.
package federation

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Cluster is one federated cluster: a control plane, its gateway site, a
// pod behind the site, and the agent.
type Cluster struct {
	Name string
	CP   *harness.ControlPlane
	Site *harness.Site
	// NAT is the router the site sits behind (Options.BehindNAT), or the
	// nodes (NodeOptions.BehindNAT), or nil.
	NAT   *harness.NATRouter
	Pod   *harness.Pod
	Agent *harness.Process
	// Client reads and writes the cluster's flotilla.io objects.
	Client client.Client
	// Args are the agent's arguments (after the binary); edit before
	// StartAgent.
	Args     []string
	StateDir string
	Bin      string
	// APIServerURL is the cluster's API server as the other clusters reach
	// it (on the federation's LAN, port 6443), and APIServerCA the path of
	// the CA bundle that verifies it: what the agent announces to its
	// consumers (--api-server-url, --api-server-ca). Empty for routed
	// sites.
	APIServerURL string
	APIServerCA  string

	iface string
}

type Options struct {
	// PodCIDRs, one per cluster.
	PodCIDRs []string
	// Routed puts the sites behind a router (no multicast) instead of on a
	// LAN.
	Routed bool
	// BehindNAT lists the clusters (by index) whose site sits behind a
	// NAT router of its own on the LAN (harness.NATRouter): it reaches
	// the LAN, nobody on the LAN reaches it first. Not with Routed.
	BehindNAT []int
	// LAN, when set, is the LAN the sites join (so a test can add hosts of
	// its own to it); default: a new one.
	LAN *harness.LAN
	// Flotilla is the binary to run; default: built from this checkout.
	Flotilla string
	// Args are given to every agent; ArgsFor adds per-cluster ones.
	Args    []string
	ArgsFor func(i int, cs []*Cluster) []string
}

// PodPort is where every cluster's pod answers TCP exchanges.
const PodPort = 7000

// agentInotify is the inotify instances an agent process takes: one, the
// listener of its userspace WireGuard device's control socket
// (wireguard-go watches the socket's directory).
const agentInotify = 1

// New starts the clusters' control planes, sites and pods (the fifth
// address of each PodCIDR, answering on PodPort); StartAgent starts their
// agents.
func New(t harness.TB, env *harness.Env, opts Options) []*Cluster {
	t.Helper()
	bin := opts.Flotilla
	if bin == "" {
		bin = harness.Flotilla(t)
	}
	n := len(opts.PodCIDRs)
	lan := opts.LAN
	var rtr *harness.Router
	switch {
	case opts.Routed:
		rtr = env.NewRouter("wan")
	case lan == nil:
		lan = env.NewLAN("lan")
	}
	// Every API server on the sites' LAN, as the other clusters reach it.
	// Routed sites have none: a routed API server would need a segment of
	// its own on the router (an address the sites' default routes reach)
	// and its certificate naming that address.
	cps := env.ControlPlanes(n, harness.ControlPlaneOptions{LAN: lan})
	publishClusterInfo(t, cps)
	for _, cp := range cps {
		// The agent's namespace, as deploy/namespace.yaml makes it: the
		// placement webhook and the kubelet API keep their CAs there, and
		// the agent is not ready until both serve.
		if err := EnsureAgentNamespace(cp); err != nil {
			t.Fatalf("%v", err)
		}
	}
	env.EnsureInotify(n*agentInotify, fmt.Sprintf("%d agents", n))
	var cs []*Cluster
	for i, cp := range cps {
		name := string(rune('a' + i))
		cidr := netip.MustParsePrefix(opts.PodCIDRs[i])
		siteOpts := harness.SiteOptions{LAN: lan, Router: rtr, PodCIDR: cidr}
		var nat *harness.NATRouter
		if slices.Contains(opts.BehindNAT, i) {
			if opts.Routed {
				t.Fatalf("federation: BehindNAT needs the sites on a LAN, not Routed")
			}
			nat = env.NewNATRouter("nat"+name, lan)
			siteOpts.LAN, siteOpts.Router = nil, nat.Router
		}
		site := env.NewSite(name, siteOpts)
		cp.ExposeTo(site.Netns)
		c, err := client.New(cp.Config, client.Options{Scheme: peerapi.Scheme()})
		if err != nil {
			t.Fatalf("%v", err)
		}
		pod := site.AddPod("p", Translate(netip.MustParseAddr("0.0.0.5"), netip.MustParsePrefix("0.0.0.0/0"), cidr))
		pod.ServeTCP(PodPort)
		cs = append(cs, &Cluster{
			Name: name, CP: cp, Site: site, NAT: nat, Pod: pod, Client: c, Bin: bin,
			StateDir:     filepath.Join(env.Dir, "state-"+name),
			APIServerURL: cp.LANURL(), APIServerCA: apiServerCA(cp),
		})
	}
	key, err := discovery.GenerateFederationKey()
	if err != nil {
		t.Fatalf("%v", err)
	}
	token, err := discovery.JoinToken{Key: key}.Encode()
	if err != nil {
		t.Fatalf("%v", err)
	}
	for i, c := range cs {
		// wireguard-go's control socket is host-wide: the name must be
		// unique on the host.
		c.iface = env.LinkName(c.Name)
		c.Args = []string{"agent",
			"--kubeconfig", c.CP.Kubeconfig,
			"--state-dir", c.StateDir,
			"--metrics-addr", "127.0.0.1:9470",
			// Each agent's site is the test's alone: tests read its
			// metrics and /trace on the site's loopback, without a token.
			"--metrics-trust-loopback",
			"--cluster-name", c.Name,
			"--pod-cidr", c.Site.PodCIDR.String(),
			"--advertise-addr", c.Site.Addr.String(),
			"--wireguard-interface", c.iface,
			"--unreachable-grace", "10s",
			// One federation; a later --federation-key in Args wins.
			"--federation-key", token,
			"--log-level", "debug",
		}
		c.Args = append(c.Args, opts.Args...)
		if opts.ArgsFor != nil {
			c.Args = append(c.Args, opts.ArgsFor(i, cs)...)
		}
	}
	return cs
}

// apiServerCA is the CA file of cp's API server when it is on a LAN.
func apiServerCA(cp *harness.ControlPlane) string {
	if cp.LANURL() == "" {
		return ""
	}
	return cp.CAFile()
}

// publishClusterInfo gives every control plane on a LAN kubeadm's
// kube-public/cluster-info: the address a provider's agent announces to
// the peers it grants offloading.
func publishClusterInfo(t harness.TB, cps []*harness.ControlPlane) {
	t.Helper()
	for _, cp := range cps {
		if cp.LANURL() == "" {
			continue
		}
		if err := cp.PublishClusterInfo(context.Background()); err != nil {
			t.Fatalf("%v", err)
		}
	}
}

// StartAgent starts (or restarts) the cluster's agent.
func (c *Cluster) StartAgent(t harness.TB) {
	t.Helper()
	c.Agent = c.Site.Start("agent-"+c.Name, append([]string{c.Bin}, c.Args...)...)
}

// DeleteLedgerSnapshot removes the snapshot of the ledger the agent
// keeps in its namespace (docs/ha.md): with its state directory wiped as
// well, the cluster comes back as a new one, with a new identity.
func (c *Cluster) DeleteLedgerSnapshot(ctx context.Context) error {
	err := c.CP.Client.CoreV1().Secrets(AgentNamespace).Delete(ctx, ha.SecretName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the ledger snapshot of %s: %w", c.Name, err)
	}
	return nil
}

// Peers returns the cluster's Peers by the peer's cluster name.
func (c *Cluster) Peers(ctx context.Context) (map[string]v1alpha1.Peer, error) {
	var list v1alpha1.PeerList
	if err := c.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	out := map[string]v1alpha1.Peer{}
	for _, p := range list.Items {
		out[p.Status.ClusterName] = p
	}
	return out, nil
}

// WaitPhases waits until, in every cluster, every other cluster is a Peer
// in phase want.
func WaitPhases(t harness.TB, cs []*Cluster, want v1alpha1.Phase, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		var problems []string
		for _, c := range cs {
			// Clusters of real nodes run the agent as a pod, not a process.
			if c.Agent != nil {
				if exited, err := c.Agent.Exited(); exited {
					t.Fatalf("agent of %s exited: %v\n%s", c.Name, err, c.Agent.Tail(30))
				}
			}
			peers, err := c.Peers(ctx)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c.Name, err))
				continue
			}
			for _, o := range cs {
				if o == c {
					continue
				}
				p, ok := peers[o.Name]
				if !ok {
					problems = append(problems, fmt.Sprintf("%s has no Peer for %s", c.Name, o.Name))
				} else if p.Status.Phase != want {
					problems = append(problems, fmt.Sprintf("%s sees %s %s", c.Name, o.Name, Describe(p)))
				}
			}
		}
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not all Peers %s after %s:\n  %s", want, timeout, strings.Join(problems, "\n  "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func Describe(p v1alpha1.Peer) string {
	var conds []string
	for _, c := range p.Status.Conditions {
		if c.Status != "True" {
			conds = append(conds, c.Type+"="+c.Reason)
		}
	}
	return fmt.Sprintf("%s (%s)", p.Status.Phase, strings.Join(conds, ","))
}

// ViewOf returns how cluster c addresses address ip of cluster o, from c's
// Peer of o.
func ViewOf(t harness.TB, c, o *Cluster, ip netip.Addr) netip.Addr {
	t.Helper()
	peers, err := c.Peers(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	p, ok := peers[o.Name]
	if !ok {
		t.Fatalf("%s has no Peer for %s", c.Name, o.Name)
	}
	for _, v := range p.Status.TheirNetworks {
		real, as := netip.MustParsePrefix(v.Range), netip.MustParsePrefix(v.As)
		if real.Contains(ip) {
			return Translate(ip, real, as)
		}
	}
	t.Fatalf("%s has no view of %s's %s: %+v", c.Name, o.Name, ip, p.Status.TheirNetworks)
	return netip.Addr{}
}

// Translate maps ip from range real to the same offset in as (IPv4).
func Translate(ip netip.Addr, real, as netip.Prefix) netip.Addr {
	u := func(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], u(as.Addr())+u(ip)-u(real.Addr()))
	return netip.AddrFrom4(out)
}

// Result is one pod-to-pod exchange: the sender dialed Dst (its view of
// the receiver's pod); the receiver saw the sender as Seen and should have
// seen Want (its own view of the sender's pod).
type Result struct {
	From, To *Cluster
	Dst      netip.Addr
	Seen     netip.Addr
	Want     netip.Addr
	Err      error
}

// Exchange pings from's pod to to's pod by from's view and makes a TCP
// exchange; Err says what failed, including the receiver seeing the wrong
// address.
func Exchange(t harness.TB, from, to *Cluster) Result {
	t.Helper()
	r := Result{From: from, To: to, Dst: ViewOf(t, from, to, to.Pod.Addr), Want: ViewOf(t, to, from, from.Pod.Addr)}
	r.exchange()
	return r
}

// exchange does the traffic part of Exchange; it never touches t, so it
// may run on any goroutine.
func (r *Result) exchange() {
	if r.Err = r.From.Pod.Ping(r.Dst); r.Err != nil {
		return
	}
	// The expected addresses come from the agents' Peers; the receiver's
	// own name does not: a wrong view that reached another pod (or looped
	// back to the sender's, at the same address in an overlapping range)
	// fails here whatever the Peers say.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.From.Pod.DialContext(ctx, "tcp", netip.AddrPortFrom(r.Dst, PodPort).String())
	if err != nil {
		r.Err = fmt.Errorf("connect %s: %w", r.Dst, err)
		return
	}
	defer c.Close()
	var a harness.Answer
	a, r.Err = harness.Hello(c, r.From.Pod.Name)
	r.Seen = a.Seen
	switch {
	case r.Err != nil:
	case a.Host != r.To.Pod.Name:
		r.Err = fmt.Errorf("%s was answered by %s, not %s's pod %s", r.Dst, a.Host, r.To.Name, r.To.Pod.Name)
	case r.Seen != r.Want:
		r.Err = fmt.Errorf("receiver saw the sender as %s, want %s (its view of the sender)", r.Seen, r.Want)
	}
}

// AllPairsTalk runs Exchange in every direction, the traffic concurrently,
// and fails t with every direction that failed.
func AllPairsTalk(t harness.TB, cs []*Cluster) {
	t.Helper()
	var rs []*Result
	for _, from := range cs {
		for _, to := range cs {
			if from != to {
				// Views are read here, on the test's goroutine: ViewOf may
				// fail the test.
				rs = append(rs, &Result{From: from, To: to, Dst: ViewOf(t, from, to, to.Pod.Addr), Want: ViewOf(t, to, from, from.Pod.Addr)})
			}
		}
	}
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); r.exchange() }()
	}
	wg.Wait()
	var failures []string
	for _, r := range rs {
		if r.Err != nil {
			failures = append(failures, fmt.Sprintf("%s -> %s (%s): %v", r.From.Name, r.To.Name, r.Dst, r.Err))
		}
	}
	sort.Strings(failures)
	if len(failures) > 0 {
		t.Logf("the data path when the exchanges failed:\n%s", Diagnose(cs))
		// Whether the failure outlives WireGuard's handshake retry (5 s)
		// tells a slow start from a broken path.
		time.Sleep(6 * time.Second)
		for _, r := range rs {
			if r.Err != nil {
				r.exchange()
				t.Logf("%s -> %s again 6 s later: %v", r.From.Name, r.To.Name, r.Err)
			}
		}
		t.Fatalf("%d of %d directions failed:\n  %s", len(failures), len(rs), strings.Join(failures, "\n  "))
	}
}

// Diagnose describes each cluster's data path for a failure message: the
// WireGuard device (peers, handshakes, bytes), the gateway's routes, the
// NAT table and the connections conntrack holds.
func Diagnose(cs []*Cluster) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "== %s (site %s, pod %s)\n", c.Name, c.Site.Addr, c.Pod.Addr)
		for _, cmd := range [][]string{
			{"wg", "show", c.iface},
			{"ip", "route", "show", "proto", "102"},
			{"nft", "list", "table", "ip", "flotilla"},
			{"cat", "/proc/net/nf_conntrack"},
		} {
			out, err := c.Site.Exec(context.Background(), cmd[0], cmd[1:]...)
			fmt.Fprintf(&b, "$ %s\n%s", strings.Join(cmd, " "), out)
			if err != nil {
				fmt.Fprintf(&b, "(%v)\n", err)
			}
		}
	}
	return b.String()
}

// Interface is the name of the cluster's WireGuard interface.
func (c *Cluster) Interface() string { return c.iface }

// Connect starts the agents of cs and waits until every pair is
// Connected.
func Connect(t harness.TB, cs []*Cluster) {
	t.Helper()
	for _, c := range cs {
		c.StartAgent(t)
	}
	WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
}

// EnsureAgentNamespace makes AgentNamespace in cp when it is not there,
// for agents started as processes (deploy/ makes it otherwise).
func EnsureAgentNamespace(cp *harness.ControlPlane) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AgentNamespace}}
	_, err := cp.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%s: create namespace %s: %w", cp.Name, AgentNamespace, err)
	}
	return nil
}
