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

// ApplyFence applies the NetworkPolicy FencePolicy in ns, a namespace of
// consumer's, and returns the resourceVersion it has since: its pods may
// reach DNS, the consumer's own namespaces here, and any address but the
// nodes', the API server's (its Service and its endpoints) and the
// metadata network. Ingress is not restricted: the consumer's own traffic
// reaches its pods through the tunnel.
func (t *Tenants) ApplyFence(ctx context.Context, consumer, ns string) (string, error) {
	denied, err := t.deniedEgress(ctx)
	if err != nil {
		return "", fmt.Errorf("apply NetworkPolicy %s/%s: %w", ns, FencePolicy, err)
	}
	pol := networkingv1ac.NetworkPolicy(FencePolicy, ns).WithLabels(offload.TenantLabels(consumer)).
		WithSpec(fencePolicySpec(consumer, denied))
	got, err := t.Client.NetworkingV1().NetworkPolicies(ns).Apply(ctx, pol, metav1.ApplyOptions{FieldManager: TenantFieldManager, Force: true})
	if err != nil {
		return "", fmt.Errorf("apply NetworkPolicy %s/%s: %w", ns, FencePolicy, err)
	}
	t.mu.Lock()
	t.fences[ns] = got.ResourceVersion
	t.mu.Unlock()
	return got.ResourceVersion, nil
}

// FenceApplied is the resourceVersion of the fence's NetworkPolicy that
// ApplyFence last wrote in namespace ns (for a grant, or a namespace
// mirrored), "" when it wrote none there.
func (t *Tenants) FenceApplied(ns string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fences[ns]
}

func (t *Tenants) forgetFence(ns string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.fences, ns)
}

// fencePolicySpec is the fence's NetworkPolicy: egress only, to DNS, to
// the consumer's namespaces, and to everything outside denied.
func fencePolicySpec(consumer string, denied []netip.Prefix) *networkingv1ac.NetworkPolicySpecApplyConfiguration {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	var v4, v6 []string
	for _, p := range denied {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
	}
	return networkingv1ac.NetworkPolicySpec().
		WithPodSelector(metav1ac.LabelSelector()).
		WithPolicyTypes(networkingv1.PolicyTypeEgress).
		WithEgress(
			networkingv1ac.NetworkPolicyEgressRule().
				WithTo(networkingv1ac.NetworkPolicyPeer().WithNamespaceSelector(
					metav1ac.LabelSelector().WithMatchLabels(map[string]string{corev1.LabelMetadataName: "kube-system"}))).
				WithPorts(networkingv1ac.NetworkPolicyPort().WithProtocol(udp).WithPort(intstr.FromInt32(53)),
					networkingv1ac.NetworkPolicyPort().WithProtocol(tcp).WithPort(intstr.FromInt32(53))),
			networkingv1ac.NetworkPolicyEgressRule().
				WithTo(networkingv1ac.NetworkPolicyPeer().WithNamespaceSelector(
					metav1ac.LabelSelector().WithMatchLabels(map[string]string{offload.LabelTenant: consumer}))),
			networkingv1ac.NetworkPolicyEgressRule().
				WithTo(networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR("0.0.0.0/0").WithExcept(v4...)),
					networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR("::/0").WithExcept(v6...))),
		)
}

// DefaultFenceRefresh is how long the addresses a fence denies (the
// nodes', the API server's) are used before they are read again: a
// namespace created meanwhile gets them without three reads first.
const DefaultFenceRefresh = 30 * time.Second

// deniedEgress is what the fence keeps a consumer's pods from, as read at
// most FenceRefresh ago; callers at once wait for one read.
func (t *Tenants) deniedEgress(ctx context.Context) ([]netip.Prefix, error) {
	t.denied.Lock()
	defer t.denied.Unlock()
	if t.denied.nets != nil && time.Since(t.denied.at) < t.fenceRefresh {
		return t.denied.nets, nil
	}
	nets, err := t.readDeniedEgress(ctx)
	if err != nil {
		return nil, err
	}
	t.denied.nets, t.denied.at = nets, time.Now()
	return nets, nil
}

// warmFence reads what the fence denies, when the last read is too old,
// while the caller makes a namespace: its fence is applied right after,
// without a read first. A failed read is the fence's to report, when it
// reads again. The returned function waits for the read.
func (t *Tenants) warmFence(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = t.deniedEgress(ctx) })
	return wg.Wait
}

// readDeniedEgress reads what the fence keeps a consumer's pods from:
// every node's addresses, the API server's Service and endpoints, and the
// metadata network; sorted, one entry per address. The three reads go at
// once.
func (t *Tenants) readDeniedEgress(ctx context.Context) ([]netip.Prefix, error) {
	var nodes *corev1.NodeList
	var svc *corev1.Service
	var eps *discoveryv1.EndpointSliceList
	errs := make([]error, 3)
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
		eps, err = t.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
		if err != nil {
			errs[2] = fmt.Errorf("list the API server's endpoints (default/kubernetes): %w", err)
		}
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	set := map[netip.Prefix]bool{MetadataNetwork: true}
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil {
			set[netip.PrefixFrom(ip, ip.BitLen())] = true
		}
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				add(a.Address)
			}
		}
	}
	if svc != nil {
		for _, s := range svc.Spec.ClusterIPs {
			add(s)
		}
	}
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				add(a)
			}
		}
	}
	out := make([]netip.Prefix, 0, len(set))
	for p := range set {
		if !p.Addr().Is4() || !MetadataNetwork.Contains(p.Addr()) || p == MetadataNetwork {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out, nil
}
