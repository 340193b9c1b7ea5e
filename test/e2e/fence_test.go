package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// metadataAddr is where clouds serve instance metadata and credentials.
var metadataAddr = netip.MustParseAddr("169.254.169.254")

// The tenant fence's NetworkPolicy tried with packets, on a provider whose
// nodes enforce NetworkPolicy (kube-network-policies): a pod consumer a
// offloaded to provider b reaches its own namespace and b's cluster DNS,
// which runs in the host network of b's other node, on port 53, and
// cannot reach another port of that node, b's API server through its
// Service, or the metadata address, each of which a pod of b's own on the
// same node reaches first.
func TestTenantFenceStopsPackets(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	harness.Require(t, harness.NetworkPolicyEnforcer)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), WorkersOf: []int{0, 1},
		NetworkPolicy: true, Masquerade: harness.FlannelNFT,
		ArgsFor: func(i int) []string {
			if i == 1 {
				return []string{"--cluster-label=region=b"}
			}
			return nil
		},
	})
	a, b := cs[0], cs[1]
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	bNodes := append([]*harness.Node{b.Gateway}, b.Workers...)

	// What the fence must keep the tenant from, in place before b grants
	// (the fence reads the addresses it denies when it is applied): a
	// line-echo server on port 80 of every node of b; b's API server as
	// its Service's endpoint, at its address on the LAN, as an API
	// server's endpoint reconciler publishes it; a metadata server at
	// 169.254.169.254:80 on a host of the LAN, which b's nodes route to.
	for _, n := range bNodes {
		n.ServeTCP(80)
	}
	publishAPIServerEndpoint(t, b)
	metadata := env.NewSite("md", harness.SiteOptions{LAN: b.LAN()})
	serveMetadata(t, metadata, bNodes)
	// The tenant's pods go to the node CoreDNS does not run on, so that
	// their queries cross the enforcer (a node's delivery to itself is
	// not judged): its node is cordoned until they run.
	dnsNode := b.CP.WaitDNS(t).Spec.NodeName
	if out, err := federation.Kubectl(b.CP, "cordon", dnsNode); err != nil {
		t.Fatalf("cordon %s, CoreDNS's node: %v\n%s", dnsNode, err, out)
	}

	changePeerSpec(t, b.Cluster, a.Name, func(s *v1alpha1.PeerSpec) { s.Offloading = v1alpha1.OffloadingGrant })
	acceptOffloading(t, a, b.Name, "region")
	waitCondition(t, a, b.Name, v1alpha1.ConditionOffloadCredential, "Ready", 90*time.Second)
	aID := peerID(t, b, a.Name)
	bID := peerID(t, a, b.Name)
	shop, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", aID)
	if err != nil {
		t.Fatal(err)
	}
	createNamespace(t, a, "shop")
	offloadNamespace(t, a, "shop", "--selector", "region=b", "--pods", "Remote")
	federation.CreateDeployment(t, a, "shop", "web", 2, nil)
	pods := waitPods(t, a, "shop", "app=web", 2, 120*time.Second, runningOn(offload.VirtualNodeName(bID)))
	theirs := remotePods(t, b, shop, 2)
	if out, err := federation.Kubectl(b.CP, "uncordon", dnsNode); err != nil {
		t.Fatalf("uncordon %s: %v\n%s", dnsNode, err, out)
	}
	tenant, peer := pods[0], theirs[pods[1].Name]
	node := theirs[tenant.Name].Spec.NodeName
	var own, other *harness.Node
	for _, n := range bNodes {
		if n.NodeName == node {
			own = n
		} else {
			other = n
		}
	}
	if own == nil || other == nil || other.NodeName != dnsNode {
		t.Fatalf("the tenant's pod runs on %q, not on the one of b's two nodes CoreDNS (on %s) does not run on", node, dnsNode)
	}
	fence, err := b.CP.Client.NetworkingV1().NetworkPolicies(shop).Get(context.Background(), tenancy.FencePolicy, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the fence of %s on b: %v", shop, err)
	}
	t.Logf("the tenant's pod %s runs on %s as %s; the fence denies %v and allows DNS to %v", tenant.Name, node, theirs[tenant.Name].Status.PodIP,
		fence.Spec.Egress[len(fence.Spec.Egress)-1].To[0].IPBlock.Except, fence.Spec.Egress[0].To)

	// b's own pod beside it, in a namespace without a fence.
	createNamespace(t, b, "plain")
	spec := federation.TestPodSpec(nil)
	spec.NodeName = node
	if _, err := b.CP.Client.CoreV1().Pods("plain").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "witness"}, Spec: spec,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPods(t, b, "plain", "", 1, 60*time.Second, runningOn(node))
	fromWitness := func(args ...string) (string, error) {
		return federation.Kubectl(b.CP, append([]string{"-n", "plain", "exec", "witness", "--", "/testserver"}, args...)...)
	}
	// The tenant's commands go through a's API server and its virtual
	// kubelet: the consumer's own reach into its pod.
	fromTenant := func(args ...string) (string, error) {
		return federation.Kubectl(a.CP, append([]string{"-n", "shop", "exec", tenant.Name, "--", "/testserver"}, args...)...)
	}

	// The enforcer has taken the tenant's pod in: its address is in the
	// set of pods whose packets the node hands to it.
	tenantIP := theirs[tenant.Name].Status.PodIP
	eventually.Within(t, 60*time.Second, "the tenant's pod judged by kube-network-policies on "+node, func() error {
		out, err := own.Exec(context.Background(), "nft", "list", "set", "inet", "kube-network-policies", "podips-v4")
		if err != nil {
			return err
		}
		if !strings.Contains(string(out), tenantIP) {
			return fmt.Errorf("%s not in the set podips-v4:\n%s", tenantIP, out)
		}
		return nil
	})

	// The positive witnesses: the tenant's pod reaches the consumer's
	// other pod, and asks the cluster DNS, in the host network of the
	// other node, through the kube-dns Service and at the node's
	// address.
	reachesOwn := func(t *testing.T) {
		url := fmt.Sprintf("http://%s:%d/hostname", peer.Status.PodIP, harness.TestServerHTTPPort)
		if out, err := fromTenant("-get", url); err != nil || strings.TrimSpace(out) != peer.Name {
			t.Fatalf("GET %s (the consumer's other pod, on %s) from the tenant's pod on %s: %q, %v", url, peer.Spec.NodeName, node, out, err)
		}
	}
	t.Run("the tenant's pod reaches its own namespace", reachesOwn)
	t.Run("the tenant's pod asks the cluster DNS in the host network of another node", func(t *testing.T) {
		const name = "kubernetes.default.svc.cluster.local"
		want := b.CP.Options.ServiceCIDR.Addr().Next().String()
		for _, server := range []string{"", netip.AddrPortFrom(other.Addr, tenancy.DNSPort).String()} {
			args, via := []string{"-lookup", name}, "the kube-dns Service"
			if server != "" {
				args, via = append(args, "-dns", server), server
			}
			// The witness: b's pod on the same node resolves it so.
			eventually.Within(t, 30*time.Second, "b's own pod resolves "+name+" through "+via, func() error {
				out, err := fromWitness(args...)
				if err == nil && strings.TrimSpace(out) != want {
					err = fmt.Errorf("%q, want %s", out, want)
				}
				return err
			})
			out, err := fromTenant(args...)
			t.Logf("the tenant's pod resolves %s through %s: %q, %v", name, via, strings.TrimSpace(out), err)
			if err != nil || strings.TrimSpace(out) != want {
				t.Errorf("the tenant's pod on %s resolves %s through %s (CoreDNS on %s): %q, %v; want %s", node, name, via, other.NodeName, out, err, want)
			}
		}
	})

	apiService := netip.AddrPortFrom(b.CP.Options.ServiceCIDR.Addr().Next(), 443)
	for _, tc := range []struct {
		what string
		to   netip.AddrPort
		echo bool // a line-echo server; else only a connection is tried
	}{
		{"another port of the node the cluster DNS runs on (" + other.NodeName + ")", netip.AddrPortFrom(other.Addr, 80), true},
		{"b's API server through its Service", apiService, false},
		{"the metadata address", netip.AddrPortFrom(metadataAddr, 80), true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			try := func(from func(...string) (string, error)) (string, error) {
				if tc.echo {
					return from("-dial", tc.to.String())
				}
				return from("-connect", tc.to.String())
			}
			// The witness: b's pod on the same node reaches it.
			eventually.Within(t, 30*time.Second, "b's own pod reaches "+tc.to.String(), func() error {
				_, err := try(fromWitness)
				return err
			})
			out, err := try(fromTenant)
			t.Logf("the tenant's pod to %s: %q, %v", tc.to, strings.TrimSpace(out), err)
			if err == nil {
				t.Errorf("the tenant's pod reached %s (%s): %q", tc.what, tc.to, out)
			}
		})
	}
	// The enforcer refused them and still judges: what it allows still
	// passes (an enforcer that died would drop everything it is handed).
	t.Run("the tenant's pod still reaches its own namespace", reachesOwn)

	// Not asserted: kube-network-policies judges what a node forwards,
	// and a pod's connection to its own node's address is delivered
	// locally (docs/testing.md), so it is not judged there.
	out, err := fromTenant("-dial", netip.AddrPortFrom(own.Addr, 80).String())
	t.Logf("the tenant's pod to its own node %s (%s:80), which this enforcer does not judge: %q, %v", own.NodeName, own.Addr, strings.TrimSpace(out), err)
}

// publishAPIServerEndpoint makes c's API server, at its address on the LAN,
// the endpoint of the Service default/kubernetes, as the API server's own
// endpoint reconciler does where it advertises a routable address (the
// harness's API servers advertise loopback and publish none).
func publishAPIServerEndpoint(t *testing.T, c *federation.NodeCluster) {
	t.Helper()
	port, name, proto := int32(harness.LANAPIPort), "https", corev1.ProtocolTCP
	ready := true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault, Labels: map[string]string{
			discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "test.flotilla.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{c.CP.LANAddr.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	if _, err := c.CP.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(context.Background(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("publish %s's API server as the endpoint of its Service: %v", c.Name, err)
	}
}

// serveMetadata serves line-echo on 169.254.169.254:80 in site s, which
// nodes route the address to.
func serveMetadata(t *testing.T, s *harness.Site, nodes []*harness.Node) {
	t.Helper()
	lo, err := s.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Netlink().AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: metadataAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatalf("add %s to %s: %v", metadataAddr, s.Name, err)
	}
	s.ServeTCP(80)
	for _, n := range nodes {
		if err := n.Netlink().RouteReplace(&netlink.Route{
			Dst: &net.IPNet{IP: metadataAddr.AsSlice(), Mask: net.CIDRMask(32, 32)},
			Gw:  s.Addr.AsSlice(),
		}); err != nil {
			t.Fatalf("route %s to %s on node %s: %v", metadataAddr, s.Addr, n.NodeName, err)
		}
	}
}
