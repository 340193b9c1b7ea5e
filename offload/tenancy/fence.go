package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// The fence every namespace of a consumer's gets, whatever the admission
// policies say: Pod Security restricted, object counts in the quota, and
// a NetworkPolicy that keeps its pods off the nodes, the API server and
// the cloud's metadata service.

// Pod Security labels of every namespace of a consumer's.
const (
	LabelPodSecurityEnforce        = "pod-security.kubernetes.io/enforce"
	LabelPodSecurityEnforceVersion = "pod-security.kubernetes.io/enforce-version"
	PodSecurityRestricted          = "restricted"
)

// AnnotationEndpointNetworks lists, comma-separated, the networks the
// consumer's EndpointSlices may point at in a namespace of its: this
// cluster's views of the consumer. The admission policy
// flotilla-consumer-endpointslices reads it; only the agent writes it.
const AnnotationEndpointNetworks = "flotilla.io/endpoint-networks"

// FencePolicy is the name of the NetworkPolicy in each namespace of a
// consumer's.
const FencePolicy = "flotilla-fence"

// The object counts per namespace, and the namespaces, a consumer gets
// when its Peer names none; its admin raises them on the Peer
// (spec.offloadLimits).
var (
	DefaultServices               int64 = 100
	DefaultSecrets                int64 = 200
	DefaultConfigMaps             int64 = 200
	DefaultEndpointSlices         int64 = 500
	DefaultPersistentVolumeClaims int64 = 20
	DefaultEphemeralStorage             = resource.MustParse("50Gi")
	DefaultNamespaces             int64 = 50
)

// MetadataNetwork is the link-local network where clouds serve instance
// metadata (169.254.169.254) and credentials with it.
var MetadataNetwork = netip.MustParsePrefix("169.254.0.0/16")

// NamespaceLimit is how many namespaces limits lets a consumer have
// mirrored: the default when it names none.
func NamespaceLimit(l grant.Limits) int64 {
	if l.Namespaces > 0 {
		return l.Namespaces
	}
	return DefaultNamespaces
}

// objectCounts adds to hard the fence's object counts, the defaults
// where f names none.
func objectCounts(hard corev1.ResourceList, f grant.Fence) error {
	for _, c := range []struct {
		name corev1.ResourceName
		n, d int64
	}{
		{corev1.ResourceServices, f.Services, DefaultServices},
		{corev1.ResourceSecrets, f.Secrets, DefaultSecrets},
		{corev1.ResourceConfigMaps, f.ConfigMaps, DefaultConfigMaps},
		{"count/endpointslices.discovery.k8s.io", f.EndpointSlices, DefaultEndpointSlices},
		{corev1.ResourcePersistentVolumeClaims, f.PersistentVolumeClaims, DefaultPersistentVolumeClaims},
	} {
		if c.n < 0 {
			return fmt.Errorf("%s limit %d: must not be negative; 0 is the default (%d)", c.name, c.n, c.d)
		}
		if c.n == 0 {
			c.n = c.d
		}
		hard[c.name] = *resource.NewQuantity(c.n, resource.DecimalSI)
	}
	storage := DefaultEphemeralStorage
	if f.EphemeralStorage != "" {
		v, err := resource.ParseQuantity(f.EphemeralStorage)
		if err != nil {
			return fmt.Errorf("ephemeral storage limit %q: not a Kubernetes quantity (like 20Gi): %w", f.EphemeralStorage, err)
		}
		if v.Sign() <= 0 {
			return fmt.Errorf("ephemeral storage limit %q: must be positive; leave it empty for the default (%s)", f.EphemeralStorage, DefaultEphemeralStorage.String())
		}
		storage = v
	}
	hard[corev1.ResourceRequestsEphemeralStorage] = storage
	return nil
}

// namespaceLabels are the labels of a namespace of a consumer's: base
// (whose it is) and Pod Security restricted.
func namespaceLabels(base map[string]string) map[string]string {
	l := make(map[string]string, len(base)+2)
	maps.Copy(l, base)
	l[LabelPodSecurityEnforce] = PodSecurityRestricted
	l[LabelPodSecurityEnforceVersion] = "latest"
	return l
}

// allowedEndpoints is the annotation's value for a consumer whose views
// are views (as Fence.EndpointNetworks lists them): those views, where
// its pods at home are, and this cluster's pod networks, where its pods
// offloaded here are.
func (t *Tenants) allowedEndpoints(ctx context.Context, views string) (string, error) {
	var nets []netip.Prefix
	for _, v := range strings.Split(views, ",") {
		if p, err := netip.ParsePrefix(v); err == nil {
			nets = append(nets, p)
		}
	}
	if t.podNetworks != nil {
		pods, err := t.podNetworks(ctx)
		if err != nil {
			return "", fmt.Errorf("this cluster's pod networks: %w", err)
		}
		return endpointNetworks(append(nets, pods...)), nil
	}
	nodes, err := t.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list nodes (their pod networks): %w", err)
	}
	for _, n := range nodes.Items {
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				nets = append(nets, p)
			}
		}
	}
	return endpointNetworks(nets), nil
}

// endpointNetworks is the annotation's value: the networks, sorted.
func endpointNetworks(nets []netip.Prefix) string {
	s := make([]string, 0, len(nets))
	for _, n := range nets {
		s = append(s, n.Masked().String())
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), ",")
}

// fenceNamespace brings the fence's labels and annotation onto ns, a
// namespace of the consumer's that exists (one made before this version,
// or whose views changed), at the version read: a namespace changed since
// is left to the next pass.
func (t *Tenants) fenceNamespace(ctx context.Context, ns *corev1.Namespace, networks string) (*corev1.Namespace, error) {
	labels := map[string]any{}
	for k, v := range namespaceLabels(nil) {
		if ns.Labels[k] != v {
			labels[k] = v
		}
	}
	have, annotated := ns.Annotations[AnnotationEndpointNetworks]
	if len(labels) == 0 && annotated && have == networks {
		return ns, nil
	}
	meta := map[string]any{"resourceVersion": ns.ResourceVersion, "annotations": map[string]any{AnnotationEndpointNetworks: networks}}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, err
	}
	got, err := t.Client.CoreV1().Namespaces().Patch(ctx, ns.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: TenantFieldManager})
	if err != nil {
		return nil, fmt.Errorf("fence namespace %s (Pod Security labels, endpoint networks): %w", ns.Name, err)
	}
	return got, nil
}

// Fence is a fence as applied: the resourceVersion of its NetworkPolicy,
// and the generation of the addresses it was made of (FenceGeneration).
type Fence struct {
	ResourceVersion string
	Generation      uint64
}

// ApplyFence applies the NetworkPolicy FencePolicy in ns, a namespace of
// consumer's, and says what it applied: its pods may reach DNS, the
// consumer's own namespaces here, and any address but the nodes', the API
// server's (its Service and its endpoints) and the metadata network.
// Ingress is not restricted: the consumer's own traffic reaches its pods
// through the tunnel.
func (t *Tenants) ApplyFence(ctx context.Context, consumer, ns string) (Fence, error) {
	addrs, gen, err := t.fenceAddresses(ctx)
	if err != nil {
		return Fence{}, fmt.Errorf("apply NetworkPolicy %s/%s: %w", ns, FencePolicy, err)
	}
	pol := networkingv1ac.NetworkPolicy(FencePolicy, ns).WithLabels(offload.TenantLabels(consumer)).
		WithSpec(fencePolicySpec(consumer, addrs))
	got, err := t.Client.NetworkingV1().NetworkPolicies(ns).Apply(ctx, pol, metav1.ApplyOptions{FieldManager: TenantFieldManager, Force: true})
	if err != nil {
		return Fence{}, fmt.Errorf("apply NetworkPolicy %s/%s: %w", ns, FencePolicy, err)
	}
	fence := Fence{ResourceVersion: got.ResourceVersion, Generation: gen}
	t.mu.Lock()
	t.fences[ns] = fence
	t.mu.Unlock()
	return fence, nil
}

// FenceApplied is the fence that ApplyFence last wrote in namespace ns
// (for a grant, or a namespace mirrored); its ResourceVersion is "" when
// it wrote none there.
func (t *Tenants) FenceApplied(ns string) Fence {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fences[ns]
}

func (t *Tenants) forgetFence(ns string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.fences, ns)
}

// FenceGeneration is the generation of the addresses fences are made of,
// as read at most FenceRefresh ago: it grows each time a read finds them
// changed. A fence applied at an older one is to be applied again.
func (t *Tenants) FenceGeneration(ctx context.Context) (uint64, error) {
	_, gen, err := t.fenceAddresses(ctx)
	return gen, err
}

// DNSPort is the port the fence lets a consumer's pods ask the cluster
// DNS on, UDP and TCP.
const DNSPort = 53

// fenceAddresses are the addresses a fence is made of.
type fenceAddresses struct {
	// denied are kept from a consumer's pods: the nodes', the API
	// server's and the metadata network.
	denied []netip.Prefix
	// dns are the cluster DNS's endpoints and the extra DNS addresses
	// configured, one address each: the pods may reach them on DNSPort
	// only, even where denied holds them (a DNS in the host network is
	// at a node's address, NodeLocal DNSCache's in the metadata network).
	dns []netip.Prefix
}

// fencePolicySpec is the fence's NetworkPolicy: egress only, to DNS (the
// pods in kube-system and the DNS addresses, on DNSPort), to the
// consumer's namespaces, and to everything outside denied.
func fencePolicySpec(consumer string, addrs fenceAddresses) *networkingv1ac.NetworkPolicySpecApplyConfiguration {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	var v4, v6 []string
	for _, p := range addrs.denied {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
	}
	dns := []*networkingv1ac.NetworkPolicyPeerApplyConfiguration{networkingv1ac.NetworkPolicyPeer().WithNamespaceSelector(
		metav1ac.LabelSelector().WithMatchLabels(map[string]string{corev1.LabelMetadataName: "kube-system"}))}
	for _, p := range addrs.dns {
		dns = append(dns, networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR(p.String())))
	}
	return networkingv1ac.NetworkPolicySpec().
		WithPodSelector(metav1ac.LabelSelector()).
		WithPolicyTypes(networkingv1.PolicyTypeEgress).
		WithEgress(
			networkingv1ac.NetworkPolicyEgressRule().
				WithTo(dns...).
				WithPorts(networkingv1ac.NetworkPolicyPort().WithProtocol(udp).WithPort(intstr.FromInt32(DNSPort)),
					networkingv1ac.NetworkPolicyPort().WithProtocol(tcp).WithPort(intstr.FromInt32(DNSPort))),
			networkingv1ac.NetworkPolicyEgressRule().
				WithTo(networkingv1ac.NetworkPolicyPeer().WithNamespaceSelector(
					metav1ac.LabelSelector().WithMatchLabels(map[string]string{offload.LabelTenant: consumer}))),
			networkingv1ac.NetworkPolicyEgressRule().
				WithTo(networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR("0.0.0.0/0").WithExcept(v4...)),
					networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR("::/0").WithExcept(v6...))),
		)
}

// DefaultFenceRefresh is how long the addresses a fence is made of (the
// nodes', the API server's, the cluster DNS's) are used before they are
// read again: a namespace created meanwhile gets them without four reads
// first.
const DefaultFenceRefresh = 30 * time.Second

// DefaultDNSService is the cluster DNS's Service as kubeadm and most
// distributions name it.
var DefaultDNSService = types.NamespacedName{Namespace: metav1.NamespaceSystem, Name: "kube-dns"}

// fenceAddresses are the addresses a fence is made of, as read at most
// FenceRefresh ago, and their generation; callers at once wait for one
// read.
func (t *Tenants) fenceAddresses(ctx context.Context) (fenceAddresses, uint64, error) {
	t.fence.Lock()
	defer t.fence.Unlock()
	if t.fence.gen > 0 && time.Since(t.fence.at) < t.fenceRefresh {
		return t.fence.addrs, t.fence.gen, nil
	}
	addrs, err := t.readFenceAddresses(ctx)
	if err != nil {
		return fenceAddresses{}, 0, err
	}
	if t.fence.gen == 0 || !addrs.equal(t.fence.addrs) {
		t.fence.gen++
	}
	t.fence.addrs, t.fence.at = addrs, time.Now()
	return addrs, t.fence.gen, nil
}

func (a fenceAddresses) equal(b fenceAddresses) bool {
	return slices.Equal(a.denied, b.denied) && slices.Equal(a.dns, b.dns)
}

// warmFence reads what a fence is made of, when the last read is too
// old, while the caller makes a namespace: its fence is applied right
// after, without a read first. A failed read is the fence's to report,
// when it reads again. The returned function waits for the read.
func (t *Tenants) warmFence(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() { _, _, _ = t.fenceAddresses(ctx) })
	return wg.Wait
}

// readFenceAddresses reads what a fence is made of: every node's
// addresses, the API server's Service and endpoints and the metadata
// network, denied; the cluster DNS's endpoints and the extra DNS
// addresses, allowed on DNSPort. Each sorted, one entry per address. The
// four reads go at once.
func (t *Tenants) readFenceAddresses(ctx context.Context) (fenceAddresses, error) {
	var nodes *corev1.NodeList
	var svc *corev1.Service
	var eps, dnsEPs *discoveryv1.EndpointSliceList
	errs := make([]error, 4)
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		if nodes, err = t.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			errs[0] = fmt.Errorf("list nodes: %w", err)
		}
	})
	wg.Go(func() {
		var err error
		svc, err = t.Client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs[1] = fmt.Errorf("read Service default/kubernetes: %w", err)
		}
		if err != nil {
			svc = nil
		}
	})
	wg.Go(func() {
		var err error
		eps, err = t.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
		if err != nil {
			errs[2] = fmt.Errorf("list the API server's endpoints (default/kubernetes): %w", err)
		}
	})
	wg.Go(func() {
		var err error
		dnsEPs, err = t.Client.DiscoveryV1().EndpointSlices(t.dnsService.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + t.dnsService.Name})
		if err != nil {
			errs[3] = fmt.Errorf("list the cluster DNS's endpoints (%s): %w", t.dnsService, err)
		}
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fenceAddresses{}, err
	}
	denied := map[netip.Prefix]bool{MetadataNetwork: true}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				addAddress(denied, a.Address)
			}
		}
	}
	if svc != nil {
		for _, s := range svc.Spec.ClusterIPs {
			addAddress(denied, s)
		}
	}
	addEndpoints(denied, eps.Items)
	// The metadata network is denied whole: an address in it is not
	// excepted again.
	maps.DeleteFunc(denied, func(p netip.Prefix, _ bool) bool {
		return p != MetadataNetwork && p.Addr().Is4() && MetadataNetwork.Contains(p.Addr())
	})
	dns := map[netip.Prefix]bool{}
	addEndpoints(dns, dnsEPs.Items)
	for _, a := range t.dnsAddresses {
		dns[netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())] = true
	}
	return fenceAddresses{denied: sortedPrefixes(denied), dns: sortedPrefixes(dns)}, nil
}

// addAddress adds the address s, when it is one, to set.
func addAddress(set map[netip.Prefix]bool, s string) {
	if ip, err := netip.ParseAddr(s); err == nil {
		ip = ip.Unmap()
		set[netip.PrefixFrom(ip, ip.BitLen())] = true
	}
}

// addEndpoints adds the addresses of slices' endpoints to set.
func addEndpoints(set map[netip.Prefix]bool, items []discoveryv1.EndpointSlice) {
	for _, s := range items {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				addAddress(set, a)
			}
		}
	}
}

func sortedPrefixes(set map[netip.Prefix]bool) []netip.Prefix {
	out := slices.Collect(maps.Keys(set))
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}
