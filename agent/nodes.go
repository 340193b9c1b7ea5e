package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// informerSyncPoll is how often an informer is asked whether it synced.
const informerSyncPoll = 5 * time.Millisecond

// clusterNodes are the cluster's Nodes as the agent's informer holds
// them: names, addresses and pod blocks.
type clusterNodes struct{ store toolscache.Store }

// watchNodes runs an informer on the cluster's Nodes, as a component, and
// returns once it has synced. changed is called when a Node comes, goes or
// changes its addresses or pod blocks.
//
// A standby's warm informer (warmStandby) is used as it is: it runs
// already, and the handler added hears every Node it holds.
func (a *Agent) watchNodes(ctx context.Context, comps *components, changed func()) (clusterNodes, error) {
	inf := a.warm.nodeInformer()
	if inf == nil {
		var err error
		if inf, err = a.newNodeInformer(); err != nil {
			return clusterNodes{}, err
		}
		comps.Go("Node informer", func(ctx context.Context) error {
			inf.RunWithContext(ctx) // returns once its goroutines have ended
			return nil
		})
	}
	_, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			// Kubelets rewrite their Node's status every few seconds;
			// only the addresses and pod blocks matter here.
			if !ok1 || !ok2 || !slices.Equal(o.Status.Addresses, c.Status.Addresses) || !slices.Equal(o.Spec.PodCIDRs, c.Spec.PodCIDRs) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	})
	if err != nil {
		return clusterNodes{}, fmt.Errorf("watch Nodes: %w", err)
	}
	// client-go's wait looks every 100 ms, a fifth of an agent's start-up:
	// wait here, and let it only say in the log that the informer synced.
	synced := func(context.Context) (bool, error) { return inf.HasSynced(), nil }
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("informer", "Nodes"))
	if wait.PollUntilContextCancel(ctx, informerSyncPoll, true, synced) != nil || !toolscache.WaitForNamedCacheSyncWithContext(ctx, inf.HasSynced) {
		return clusterNodes{}, fmt.Errorf("watch Nodes: not synced: %w", context.Cause(ctx))
	}
	return clusterNodes{inf.GetStore()}, nil
}

// newNodeInformer is an informer of the cluster's Nodes that keeps only
// what the agent reads of them (nodeFieldsRead); not started.
func (a *Agent) newNodeInformer() (toolscache.SharedIndexInformer, error) {
	inf := kubeclient.NewInformer(&corev1.Node{}, a.kube.CoreV1().Nodes(), nil)
	if err := inf.SetTransform(nodeFieldsRead); err != nil {
		return nil, fmt.Errorf("watch Nodes: %w", err)
	}
	return inf, nil
}

// addresses are every Node's addresses.
func (c clusterNodes) addresses() []netip.Prefix {
	var out []netip.Prefix
	for _, obj := range c.store.List() {
		if n, ok := obj.(*corev1.Node); ok && !virtual(n) {
			out = append(out, nodeAddresses(n)...)
		}
	}
	return out
}

// fabric lists the Nodes as the fabric plan names them: the first IPv4
// InternalIP and the IPv4 pod blocks of each.
func (c clusterNodes) fabric() []fabricapi.Node {
	var out []fabricapi.Node
	for _, obj := range c.store.List() {
		n, ok := obj.(*corev1.Node)
		if !ok || virtual(n) {
			continue
		}
		fn := fabricapi.Node{Name: n.Name, Addr: internalIPv4(n)}
		for _, s := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
				fn.PodCIDRs = append(fn.PodCIDRs, p.Masked())
			}
		}
		out = append(out, fn)
	}
	return out
}

// virtualNode reports whether the Node named name is a virtual node.
func (c clusterNodes) virtualNode(name string) bool {
	obj, ok, _ := c.store.GetByKey(name)
	n, isNode := obj.(*corev1.Node)
	return ok && isNode && virtual(n)
}

// podBlocks are the IPv4 pod blocks (spec.podCIDRs) of every Node.
func (c clusterNodes) podBlocks() []netip.Prefix {
	var out []netip.Prefix
	for _, n := range c.fabric() {
		out = append(out, n.PodCIDRs...)
	}
	return out
}

// internalIPv4 is a Node's first IPv4 InternalIP, its address on the node
// network; zero if it has none.
func internalIPv4(n *corev1.Node) netip.Addr {
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && ip.Unmap().Is4() {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// virtual reports whether n is a virtual node, which stands for a provider
// (vnode.Nodes): neither its address nor the pod block the
// controller manager may give it are this cluster's.
func virtual(n *corev1.Node) bool { return n.Labels[v1alpha1.LabelVirtualNode] == "true" }

// nodeFieldsRead keeps of a Node what the agent reads (addresses, pod
// blocks, whether it is virtual): the informer holds every Node of the
// cluster.
func nodeFieldsRead(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: virtualLabel(n)},
		Spec:       corev1.NodeSpec{PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

func virtualLabel(n *corev1.Node) map[string]string {
	if v, ok := n.Labels[v1alpha1.LabelVirtualNode]; ok {
		return map[string]string{v1alpha1.LabelVirtualNode: v}
	}
	return nil
}

// nodeAddresses returns a Node's internal and external addresses as host
// prefixes (/32, /128).
func nodeAddresses(n *corev1.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil || ip.Zone() != "" {
			continue
		}
		ip = ip.Unmap()
		if p := netip.PrefixFrom(ip, ip.BitLen()); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}
