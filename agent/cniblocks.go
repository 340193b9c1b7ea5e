package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// Where the pod blocks announced come from, in the order they are
// preferred: a CNI with its own IPAM leaves the Nodes' spec.podCIDRs
// empty and records its blocks itself.
const (
	sourceNodes  = "Nodes' spec.podCIDRs"
	sourceCalico = "Calico BlockAffinities"
	sourceCilium = "CiliumNodes"
	sourcePods   = "pods' addresses"
)

var (
	calicoBlockAffinities = schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "blockaffinities"}
	ciliumNodes           = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnodes"}
)

// DefaultPodBlockBits is the size of the block a pod's address stands for
// when the blocks are learned from the pods (--pod-block-bits).
const DefaultPodBlockBits = 24

// nodeBlock is an IPv4 pod block and the node it is on ("" when unknown).
type nodeBlock struct {
	Node  string
	Block netip.Prefix
}

// calicoBlock reads a Calico BlockAffinity: its block, once the node's
// claim on it is confirmed.
func calicoBlock(u *unstructured.Unstructured) []nodeBlock {
	state, _, _ := unstructured.NestedString(u.Object, "spec", "state")
	deleted, _, _ := unstructured.NestedString(u.Object, "spec", "deleted")
	if state != "confirmed" || deleted == "true" {
		return nil
	}
	cidr, _, _ := unstructured.NestedString(u.Object, "spec", "cidr")
	node, _, _ := unstructured.NestedString(u.Object, "spec", "node")
	if p, ok := ipv4Block(cidr); ok {
		return []nodeBlock{{Node: node, Block: p}}
	}
	return nil
}

// ciliumBlocks reads a CiliumNode: the pod blocks of its node (Cilium's
// cluster-pool IPAM).
func ciliumBlocks(u *unstructured.Unstructured) []nodeBlock {
	cidrs, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "ipam", "podCIDRs")
	var out []nodeBlock
	for _, c := range cidrs {
		if p, ok := ipv4Block(c); ok {
			out = append(out, nodeBlock{Node: u.GetName(), Block: p})
		}
	}
	return out
}

// ipv4Block parses an IPv4 CIDR as its block; anything else is left out
// (the tunnel routes IPv4 only).
func ipv4Block(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

// blockOf is the block of bits an IPv4 address stands for.
func blockOf(a netip.Addr, bits int) (netip.Prefix, bool) {
	a = a.Unmap()
	if !a.Is4() || a.Zone() != "" || bits < 0 || bits > 32 {
		return netip.Prefix{}, false
	}
	p, err := a.Prefix(bits)
	return p, err == nil
}

// podAddressBlocks are the blocks of a pod's addresses. Pods on the host
// network have the node's address, and pods on virtual nodes a
// provider's: neither is this cluster's pod network.
func podAddressBlocks(p *corev1.Pod, bits int, virtualNode func(string) bool) []nodeBlock {
	if p.Spec.HostNetwork || p.Spec.NodeName == "" || virtualNode(p.Spec.NodeName) {
		return nil
	}
	var out []nodeBlock
	for _, ip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		if b, ok := blockOf(a, bits); ok && !slices.Contains(out, nodeBlock{p.Spec.NodeName, b}) {
			out = append(out, nodeBlock{Node: p.Spec.NodeName, Block: b})
		}
	}
	return out
}

// The transforms keep of each object what the readers above read: the
// informers hold every object of their kind in the cluster.

func calicoFieldsRead(obj any) (any, error) {
	return keepFields(obj, []string{"spec", "state"}, []string{"spec", "deleted"}, []string{"spec", "cidr"}, []string{"spec", "node"})
}

func ciliumFieldsRead(obj any) (any, error) {
	return keepFields(obj, []string{"spec", "ipam", "podCIDRs"})
}

// keepFields copies of an unstructured object its identity and the fields
// at paths.
func keepFields(obj any, paths ...[]string) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetName(u.GetName())
	out.SetUID(u.GetUID())
	out.SetResourceVersion(u.GetResourceVersion())
	for _, path := range paths {
		if v, found, err := unstructured.NestedFieldNoCopy(u.Object, path...); err == nil && found {
			if err := unstructured.SetNestedField(out.Object, v, path...); err != nil {
				return nil, fmt.Errorf("keep %v of %s: %w", path, u.GetName(), err)
			}
		}
	}
	return out, nil
}

func podFieldsRead(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status:     corev1.PodStatus{PodIPs: p.Status.PodIPs},
	}, nil
}

// learnedSource is one source of pod blocks as watched: its name and what
// it holds now.
type learnedSource struct {
	Name   string
	Blocks func() []nodeBlock
}

// firstWithBlocks picks, of the sources in their order, the first that
// holds a block, and its blocks.
func firstWithBlocks(sources []learnedSource) (string, []nodeBlock) {
	for _, s := range sources {
		if b := s.Blocks(); len(b) > 0 {
			return s.Name, b
		}
	}
	return "", nil
}

// learnedBlocks are the pod blocks a CNI with its own IPAM allocated, as
// the agent's informers hold them; the zero value holds none.
type learnedBlocks struct{ sources []learnedSource }

// current returns the blocks of the first source that has some, and its
// name.
func (l learnedBlocks) current() (string, []nodeBlock) { return firstWithBlocks(l.sources) }

// watching names the sources watched.
func (l learnedBlocks) watching() []string {
	var out []string
	for _, s := range l.sources {
		out = append(out, s.Name)
	}
	return out
}

// watchLearnedBlocks watches where a CNI with its own IPAM records its
// blocks: Calico's BlockAffinities and CiliumNodes where the cluster
// serves those kinds, else the pods' addresses, each taken as its block
// of bits. The informers run as components; it returns once they have
// synced. changed is called when an object comes, goes or changes.
func (a *Agent) watchLearnedBlocks(ctx context.Context, comps *components, bits int, virtualNode func(string) bool, changed func()) (learnedBlocks, error) {
	var l learnedBlocks
	var cni []schema.GroupVersionResource
	for _, gvr := range []schema.GroupVersionResource{calicoBlockAffinities, ciliumNodes} {
		served, err := serves(a.kube.Discovery(), gvr)
		if err != nil {
			return l, err
		}
		if served {
			cni = append(cni, gvr)
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}
	var infs []toolscache.SharedIndexInformer
	if len(cni) > 0 {
		dyn, err := dynamic.NewForConfig(a.restCfg)
		if err != nil {
			return l, fmt.Errorf("client of the CNI's kinds: %w", err)
		}
		for _, gvr := range cni {
			name, read, transform := sourceCalico, calicoBlock, calicoFieldsRead
			if gvr == ciliumNodes {
				name, read, transform = sourceCilium, ciliumBlocks, ciliumFieldsRead
			}
			inf := kubeclient.NewInformer(&unstructured.Unstructured{}, dyn.Resource(gvr), nil)
			if err := inf.SetTransform(transform); err != nil {
				return l, fmt.Errorf("watch %s: %w", name, err)
			}
			if _, err := inf.AddEventHandler(handler); err != nil {
				return l, fmt.Errorf("watch %s: %w", name, err)
			}
			store := inf.GetStore()
			l.sources = append(l.sources, learnedSource{Name: name, Blocks: func() []nodeBlock {
				var out []nodeBlock
				for _, obj := range store.List() {
					if u, ok := obj.(*unstructured.Unstructured); ok {
						out = append(out, read(u)...)
					}
				}
				return out
			}})
			infs = append(infs, inf)
		}
		comps.Go("CNI block informers", func(ctx context.Context) error {
			var wg sync.WaitGroup
			for _, inf := range infs {
				wg.Go(func() { inf.RunWithContext(ctx) })
			}
			wg.Wait()
			return nil
		})
	} else {
		// Only pods with an address of the pod network, and still
		// holding it.
		selector := "spec.hostNetwork=false,status.phase!=Succeeded,status.phase!=Failed"
		inf := kubeclient.NewInformer(&corev1.Pod{}, a.kube.CoreV1().Pods(""), func(o *metav1.ListOptions) { o.FieldSelector = selector })
		if err := inf.SetTransform(podFieldsRead); err != nil {
			return l, fmt.Errorf("watch pods: %w", err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { changed() },
			UpdateFunc: func(old, cur any) {
				o, ok1 := old.(*corev1.Pod)
				c, ok2 := cur.(*corev1.Pod)
				if !ok1 || !ok2 || o.Spec.NodeName != c.Spec.NodeName || !slices.Equal(o.Status.PodIPs, c.Status.PodIPs) {
					changed()
				}
			},
			DeleteFunc: func(any) { changed() },
		}); err != nil {
			return l, fmt.Errorf("watch pods: %w", err)
		}
		store := inf.GetStore()
		l.sources = append(l.sources, learnedSource{Name: sourcePods, Blocks: func() []nodeBlock {
			var out []nodeBlock
			for _, obj := range store.List() {
				if p, ok := obj.(*corev1.Pod); ok {
					for _, b := range podAddressBlocks(p, bits, virtualNode) {
						if !slices.Contains(out, b) {
							out = append(out, b)
						}
					}
				}
			}
			return out
		}})
		infs = append(infs, inf)
		comps.Go("pod address informer", func(ctx context.Context) error {
			inf.RunWithContext(ctx)
			return nil
		})
	}
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("informer", "pod blocks"))
	for _, inf := range infs {
		synced := func(context.Context) (bool, error) { return inf.HasSynced(), nil }
		if wait.PollUntilContextCancel(ctx, informerSyncPoll, true, synced) != nil {
			return l, fmt.Errorf("watch %v: not synced: %w", l.watching(), context.Cause(ctx))
		}
	}
	return l, nil
}

// serves reports whether the API server serves gvr; a group or version it
// does not know (the CNI's CRD is not installed) is not an error.
func serves(d discoveryClient, gvr schema.GroupVersionResource) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ask the API server whether it serves %s: %w", gvr.GroupResource(), err)
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource }), nil
}

type discoveryClient interface {
	ServerResourcesForGroupVersion(string) (*metav1.APIResourceList, error)
}

// withLearnedBlocks adds to the fabric plan's Nodes the blocks a CNI
// allocated to each, where its Node has no spec.podCIDRs: the gateway
// routes them to it. A block also claimed by another node, or that
// overlaps another node's, goes to none: the plan's blocks must not
// overlap.
func withLearnedBlocks(nodes []fabricapi.Node, learned []nodeBlock) []fabricapi.Node {
	owners := map[netip.Prefix][]string{}
	for _, b := range learned {
		if b.Node != "" && !slices.Contains(owners[b.Block], b.Node) {
			owners[b.Block] = append(owners[b.Block], b.Node)
		}
	}
	var all []netip.Prefix
	for _, n := range nodes {
		all = append(all, n.PodCIDRs...)
	}
	for b := range owners {
		all = append(all, b)
	}
	overlaps := func(b netip.Prefix) bool {
		return slices.ContainsFunc(all, func(o netip.Prefix) bool { return o != b && o.Overlaps(b) })
	}
	out := slices.Clone(nodes)
	for i, n := range out {
		if len(n.PodCIDRs) > 0 {
			continue
		}
		var blocks []netip.Prefix
		for b, names := range owners {
			if len(names) == 1 && names[0] == n.Name && !overlaps(b) {
				blocks = append(blocks, b)
			}
		}
		slices.SortFunc(blocks, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		out[i].Blocks = blocks
	}
	return out
}

// blocksOnly are the prefixes of learned blocks.
func blocksOnly(bs []nodeBlock) []netip.Prefix {
	var out []netip.Prefix
	for _, b := range bs {
		if !slices.Contains(out, b.Block) {
			out = append(out, b.Block)
		}
	}
	return out
}
