package ha

import (
	"context"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// Replicas follows the agent's pods in its namespace, to tell whether a
// replica other than this one could take the Lease: an active replica
// that cannot renew keeps its data path when none could.
type Replicas struct {
	inf cache.SharedIndexInformer
	// self is this replica's pod; empty outside a pod.
	self string
}

// NewReplicas follows the agent's pods (AgentSelector) in namespace; self
// is this replica's own pod, not counted.
func NewReplicas(kube kubeclient.Interface, namespace, self string) *Replicas {
	inf := kubeclient.NewInformer(&corev1.Pod{}, kube.CoreV1().Pods(namespace), func(o *metav1.ListOptions) {
		o.LabelSelector = AgentSelector
	})
	inf.SetTransform(kubeclient.DropManagedFields)
	return &Replicas{inf: inf, self: self}
}

// Run follows the pods until ctx ends.
func (r *Replicas) Run(ctx context.Context) error {
	r.inf.RunWithContext(ctx)
	return nil
}

// Others reports whether another of the agent's pods, as last seen,
// could take the Lease: one that has not ended (succeeded or failed).
// Before the pods were first listed, it says one could. A pod made while
// the API server cannot be reached is not seen: docs/ha.md says so.
func (r *Replicas) Others() bool {
	if !r.inf.HasSynced() {
		return true
	}
	for _, o := range r.inf.GetStore().List() {
		p := o.(*corev1.Pod)
		if p.Name == r.self || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		return true
	}
	return false
}

// Addrs returns the addresses, with port, of the other agent pods as last
// seen that have an IP, have not ended and are not being deleted: where
// a heartbeat reaches them (the agent's pods use the host's network, and
// all listen on the same port). A pod being deleted stops as a standby
// (it takes nothing early once stopping): its silence is no reason to
// fence.
func (r *Replicas) Addrs(port uint16) func() []netip.AddrPort {
	return func() []netip.AddrPort {
		var addrs []netip.AddrPort
		for _, o := range r.inf.GetStore().List() {
			p := o.(*corev1.Pod)
			if p.Name == r.self || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
				addrs = append(addrs, netip.AddrPortFrom(ip.Unmap(), port))
			}
		}
		return addrs
	}
}
