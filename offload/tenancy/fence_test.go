package tenancy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The fence of a tenant, as the API server holds it: Pod Security
// restricted and the endpoint networks on the namespace, the
// NetworkPolicy with its rules. A policy deleted or changed is put back
// by the next Ensure, and goes with the tenant.
//
// The harness's nodes run the bridge CNI, which enforces no
// NetworkPolicy: this checks the object the CNI would enforce, not
// packets.
func (s *suite) testFence(t *testing.T) {
	ctx, consumer := t.Context(), offloadtest.NewConsumer(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "fence-node-" + consumer[:8]}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.9.1.0/24"}}}
	if _, err := s.cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cp.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.77"}, {Type: corev1.NodeHostName, Address: "fence"}}
	if _, err := s.cp.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The API server's endpoints, as kube-controller-manager mirrors them
	// (the harness runs none).
	apiSlice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes-" + consumer[:8], Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.88"}}},
	}
	if _, err := s.cp.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, apiSlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.cp.Client.DiscoveryV1().EndpointSlices("default").Delete(context.Background(), apiSlice.Name, metav1.DeleteOptions{})
	})

	// The cluster DNS in the host network, at the node's address.
	dnsSlice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kube-dns-" + consumer[:8], Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.77"}}},
	}
	if _, err := s.cp.Client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, dnsSlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.cp.Client.DiscoveryV1().EndpointSlices("kube-system").Delete(context.Background(), dnsSlice.Name, metav1.DeleteOptions{})
	})

	// Tenants of their own: the suite's read the addresses a fence is
	// made of before this node was there, and use them for
	// DefaultFenceRefresh. NodeLocal DNSCache's address is configured.
	s = s.withTenants(t, 0, netip.MustParseAddr("169.254.20.10"))
	limits := grant.Limits{Fence: grant.Fence{EndpointNetworks: "10.80.0.0/16"}}
	s.ensure(t, consumer, limits)
	ns := offload.TenantNamespace(consumer)
	n, err := s.cp.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[LabelPodSecurityEnforce] != PodSecurityRestricted {
		t.Errorf("namespace labels %v, want %s=%s", n.Labels, LabelPodSecurityEnforce, PodSecurityRestricted)
	}
	if got := n.Annotations[AnnotationEndpointNetworks]; got != "10.80.0.0/16,10.9.1.0/24" {
		t.Errorf("annotation %s=%q, want the consumer's view and the nodes' pod networks", AnnotationEndpointNetworks, got)
	}

	policies := s.cp.Client.NetworkingV1().NetworkPolicies(ns)
	check := func(t *testing.T) {
		t.Helper()
		pol, err := policies.Get(ctx, FencePolicy, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("NetworkPolicy %s: %v", FencePolicy, err)
		}
		if err := s.fenceRulesOK(ctx, consumer, pol); err != nil {
			t.Errorf("NetworkPolicy %s/%s: %v\n%+v", ns, FencePolicy, err, pol.Spec)
		}
	}
	check(t)

	if err := policies.Delete(ctx, FencePolicy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.ensure(t, consumer, limits)
	t.Run("recreated after a delete", check)

	open := `{"spec":{"egress":[{}]}}`
	if _, err := policies.Patch(ctx, FencePolicy, types.MergePatchType, []byte(open), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.ensure(t, consumer, limits)
	t.Run("put back after a change", check)

	// An older namespace without the fence's labels gets them.
	strip := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, LabelPodSecurityEnforce, AnnotationEndpointNetworks)
	if _, err := s.cp.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(strip), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.ensure(t, consumer, limits)
	if n, err := s.cp.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil ||
		n.Labels[LabelPodSecurityEnforce] != PodSecurityRestricted || n.Annotations[AnnotationEndpointNetworks] == "" {
		t.Errorf("a namespace that lost the fence's labels, after Ensure: %v, %v", n.ObjectMeta, err)
	}

	if err := s.tenants.Remove(ctx, consumer); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 60*time.Second, "the NetworkPolicy gone with its tenant", func() error {
		if _, err := policies.Get(ctx, FencePolicy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("NetworkPolicy %s/%s: %v, want NotFound", ns, FencePolicy, err)
		}
		return nil
	})
}

// fenceRulesOK says how pol differs from the fence: egress only, every
// pod; DNS on port 53 in kube-system, at NodeLocal DNSCache's address and
// at the cluster DNS's endpoint; the consumer's namespaces; any
// address but the nodes', the API server's and the metadata network.
func (s *suite) fenceRulesOK(ctx context.Context, consumer string, pol *networkingv1.NetworkPolicy) error {
	if pol.Labels[offload.LabelTenant] != consumer {
		return fmt.Errorf("labels %v: not the tenant's", pol.Labels)
	}
	spec := pol.Spec
	if len(spec.PodSelector.MatchLabels)+len(spec.PodSelector.MatchExpressions) != 0 ||
		!slices.Equal(spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) || len(spec.Egress) != 3 {
		return fmt.Errorf("not an egress policy of every pod with three rules")
	}
	dns := spec.Egress[0]
	if len(dns.To) != 3 || dns.To[0].NamespaceSelector == nil || dns.To[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "kube-system" ||
		dns.To[1].IPBlock == nil || dns.To[1].IPBlock.CIDR != "169.254.20.10/32" || dns.To[2].IPBlock == nil || dns.To[2].IPBlock.CIDR != "192.0.2.77/32" ||
		len(dns.Ports) != 2 || dns.Ports[0].Port.IntValue() != 53 || dns.Ports[1].Port.IntValue() != 53 {
		return fmt.Errorf("rule 1 is not DNS on port 53 in kube-system, at NodeLocal DNSCache's address and at the cluster DNS's endpoint in the host network: %+v", dns)
	}
	own := spec.Egress[1]
	if len(own.To) != 1 || own.To[0].NamespaceSelector == nil || own.To[0].NamespaceSelector.MatchLabels[offload.LabelTenant] != consumer || len(own.Ports) != 0 {
		return fmt.Errorf("rule 2 is not the consumer's namespaces: %+v", own)
	}
	rest := spec.Egress[2]
	if len(rest.To) != 2 || rest.To[0].IPBlock == nil || rest.To[0].IPBlock.CIDR != "0.0.0.0/0" || rest.To[1].IPBlock == nil || rest.To[1].IPBlock.CIDR != "::/0" {
		return fmt.Errorf("rule 3 is not every address: %+v", rest)
	}
	// What must be excepted, read from the cluster as the test sees it.
	want := []string{"192.0.2.77/32", "192.0.2.88/32", "169.254.0.0/16"}
	svc, err := s.cp.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return err
	}
	want = append(want, svc.Spec.ClusterIP+"/32")
	for _, w := range want {
		if !slices.Contains(rest.To[0].IPBlock.Except, w) {
			return fmt.Errorf("rule 3 excepts %v, not %s", rest.To[0].IPBlock.Except, w)
		}
	}
	return nil
}

// Pod Security restricted holds in a tenant without any admission policy
// of ours: with its own token the consumer runs a restricted pod (the
// witness that it gets as far as admission) and is refused a privileged
// one, one that mounts the node's files and one without a seccomp
// profile.
func (s *suite) testRestrictedWithoutPolicies(t *testing.T) {
	ctx, consumer := t.Context(), offloadtest.NewConsumer(t)
	applyConsumerRole(t, s.cp)
	s.ensure(t, consumer, grant.Limits{})
	tok := s.issue(t, consumer)
	cfg := rest.AnonymousClientConfig(s.cp.Config)
	cfg.BearerToken = tok.Value.Reveal()
	pods := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(offload.TenantNamespace(consumer))

	pod := func(name string, change func(*corev1.PodSpec)) *corev1.Pod {
		spec := harness.Restricted(&corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}})
		change(spec)
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: *spec}
	}
	// The quota admits pods once its controller has computed usage.
	eventually.Within(t, 30*time.Second, "the consumer creates a restricted pod", func() error {
		_, err := pods.Create(ctx, pod("witness", func(*corev1.PodSpec) {}), metav1.CreateOptions{})
		return err
	})
	yes := true
	for _, tc := range []struct {
		what   string
		change func(*corev1.PodSpec)
	}{
		{"privileged", func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Privileged, s.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes, nil
		}},
		{"hostPath", func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		}},
		{"unconfined seccomp", func(s *corev1.PodSpec) {
			s.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}},
		{"root", func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot, s.SecurityContext.RunAsUser = nil, nil }},
	} {
		_, err := pods.Create(ctx, pod(strings.ToLower(strings.ReplaceAll(tc.what, " ", "-")), tc.change), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity \"restricted") {
			t.Errorf("the consumer creates a %s pod: %v, want Forbidden by PodSecurity restricted", tc.what, err)
			continue
		}
		t.Logf("%s pod refused: %d %s", tc.what, statusCode(err), err)
	}
}

// statusCode is the HTTP status of an API error.
func statusCode(err error) int32 {
	if s, ok := err.(apierrors.APIStatus); ok {
		return s.Status().Code
	}
	return 0
}

// applyConsumerRole applies deploy/rbac.yaml (the ClusterRole the
// consumer's RoleBinding names) and nothing of admission.yaml.
func applyConsumerRole(t *testing.T, cp *harness.ControlPlane) {
	t.Helper()
	cmd := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), "--kubeconfig", cp.Kubeconfig,
		"apply", "--server-side", "-f", offloadtest.DeployFile("namespace.yaml"), "-f", offloadtest.DeployFile("rbac.yaml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply deploy/rbac.yaml: %v\n%s", err, out)
	}
}

// The fence's rules, judged as an enforcer judges a packet to an address
// outside the pod network: DNS on port 53, UDP and TCP, reaches the
// cluster DNS's endpoints and the extra DNS addresses, even at a node's
// address or in the metadata network; every other port there, the other
// nodes and the metadata service stay denied; the internet is open.
func TestFencePolicySpec(t *testing.T) {
	node, hostDNS := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
	nodeLocal, node6 := netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("2001:db8::11")
	addrs := fenceAddresses{
		denied: []netip.Prefix{netip.PrefixFrom(node, 32), netip.PrefixFrom(hostDNS, 32), netip.PrefixFrom(node6, 128), MetadataNetwork},
		dns:    []netip.Prefix{netip.PrefixFrom(hostDNS, 32), netip.PrefixFrom(nodeLocal, 32), netip.PrefixFrom(node6, 128)},
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	for _, tc := range []struct {
		what  string
		addrs fenceAddresses
		to    netip.Addr
		proto corev1.Protocol
		port  int32
		want  bool
	}{
		{"DNS in the host network, UDP", addrs, hostDNS, udp, 53, true},
		{"DNS in the host network, TCP", addrs, hostDNS, tcp, 53, true},
		{"another port of the DNS's node", addrs, hostDNS, tcp, 80, false},
		{"UDP to another port of the DNS's node", addrs, hostDNS, udp, 5353, false},
		{"port 53 of a node without DNS", addrs, node, udp, 53, false},
		{"another port of a node without DNS", addrs, node, tcp, 10250, false},
		{"NodeLocal DNSCache", addrs, nodeLocal, udp, 53, true},
		{"another port of NodeLocal DNSCache's address", addrs, nodeLocal, tcp, 8080, false},
		{"the metadata service", addrs, netip.MustParseAddr("169.254.169.254"), tcp, 80, false},
		{"the metadata service on port 53", addrs, netip.MustParseAddr("169.254.169.254"), udp, 53, false},
		{"DNS at an IPv6 node address", addrs, node6, udp, 53, true},
		{"another port of an IPv6 node", addrs, node6, tcp, 22, false},
		{"the internet", addrs, netip.MustParseAddr("198.51.100.1"), tcp, 443, true},
		{"the internet over IPv6", addrs, netip.MustParseAddr("2001:db8:1::1"), tcp, 443, true},
		{"a node's DNS without DNS addresses", fenceAddresses{denied: addrs.denied}, hostDNS, udp, 53, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			spec := appliedSpec(t, fencePolicySpec("c0ffee", tc.addrs))
			if got := egressAllowed(spec, tc.to, tc.proto, tc.port); got != tc.want {
				t.Errorf("%s %s:%d allowed %v, want %v; egress %+v", tc.proto, tc.to, tc.port, got, tc.want, spec.Egress)
			}
		})
	}
	// The pods of kube-system, wherever they are, are asked on port 53
	// only.
	spec := appliedSpec(t, fencePolicySpec("c0ffee", fenceAddresses{}))
	if len(spec.Egress) != 3 || len(spec.Egress[0].To) != 1 || spec.Egress[0].To[0].NamespaceSelector == nil ||
		spec.Egress[0].To[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "kube-system" || len(spec.Egress[0].Ports) != 2 {
		t.Errorf("without DNS addresses, the first rule is not DNS in kube-system alone: %+v", spec.Egress)
	}
}

// appliedSpec is the NetworkPolicySpec an apply of spec writes.
func appliedSpec(t *testing.T, spec *networkingv1ac.NetworkPolicySpecApplyConfiguration) networkingv1.NetworkPolicySpec {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var out networkingv1.NetworkPolicySpec
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// egressAllowed says whether spec lets its pods send to an address that
// is no pod's (peers that select pods never match it), as NetworkPolicy's
// rules are defined: any rule whose ports and peers both match.
func egressAllowed(spec networkingv1.NetworkPolicySpec, to netip.Addr, proto corev1.Protocol, port int32) bool {
	for _, r := range spec.Egress {
		portOK := len(r.Ports) == 0
		for _, p := range r.Ports {
			pr := corev1.ProtocolTCP
			if p.Protocol != nil {
				pr = *p.Protocol
			}
			if pr == proto && (p.Port == nil || p.Port.IntVal == port) {
				portOK = true
			}
		}
		peerOK := len(r.To) == 0
		for _, peer := range r.To {
			if peer.IPBlock == nil {
				continue
			}
			if !netip.MustParsePrefix(peer.IPBlock.CIDR).Contains(to) {
				continue
			}
			excepted := false
			for _, e := range peer.IPBlock.Except {
				excepted = excepted || netip.MustParsePrefix(e).Contains(to)
			}
			peerOK = peerOK || !excepted
		}
		if portOK && peerOK {
			return true
		}
	}
	return false
}
