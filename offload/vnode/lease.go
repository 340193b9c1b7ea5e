package vnode

import (
	"context"
	"fmt"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// renewLease renews the Lease of provider id's virtual node when it is
// due, and says when it is due next. The Lease is renewed whether or not
// the node is Ready: its Ready condition says the truth, a lapsed Lease
// would only make the node lifecycle controller say Unknown.
func (v *Nodes) renewLease(ctx context.Context, id string, node *corev1.Node, now time.Time) (time.Duration, error) {
	v.mu.Lock()
	last := v.leases[id]
	v.mu.Unlock()
	if last != nil && ownedBy(last, node) && last.Spec.RenewTime != nil {
		if next := last.Spec.RenewTime.Add(virtualNodeLeaseRenew); now.Before(next) {
			return next.Sub(now), nil
		}
	}
	lease, err := v.writeLease(ctx, node, last, now)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		delete(v.leases, id) // read it again next time
		return 0, err
	}
	v.leases[id] = lease
	return virtualNodeLeaseRenew, nil
}

// writeLease creates or renews node's Lease; last is the one written
// before (nil: read it first).
func (v *Nodes) writeLease(ctx context.Context, node *corev1.Node, last *coordinationv1.Lease, now time.Time) (*coordinationv1.Lease, error) {
	leases := v.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	if last == nil {
		cur, err := leases.Get(ctx, node.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := leases.Create(ctx, virtualNodeLease(nil, node, now), metav1.CreateOptions{FieldManager: FieldManager})
			if err != nil {
				return nil, fmt.Errorf("create the Lease of virtual node %s: %w", node.Name, err)
			}
			v.m.writes.WithLabelValues("lease").Inc()
			return created, nil
		case err != nil:
			return nil, fmt.Errorf("read the Lease of virtual node %s: %w", node.Name, err)
		case !isOurVirtualNode(cur):
			return nil, fmt.Errorf("lease %s/%s: %w", corev1.NamespaceNodeLease, node.Name, errForeignNode)
		}
		last = cur
	}
	// A whole-object update: the Lease is ours alone, and its
	// resourceVersion fails the write if anyone changed it.
	renewed, err := leases.Update(ctx, virtualNodeLease(last, node, now), metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, fmt.Errorf("renew the Lease of virtual node %s: %w", node.Name, err)
	}
	v.m.writes.WithLabelValues("lease").Inc()
	return renewed, nil
}

// virtualNodeLease is node's Lease renewed at now, from last (nil: a new
// one). Owned by the Node, as a kubelet's: it goes with it.
func virtualNodeLease(last *coordinationv1.Lease, node *corev1.Node, now time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{}
	if last != nil {
		l = last.DeepCopy()
	}
	l.Name, l.Namespace = node.Name, corev1.NamespaceNodeLease
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	maps.Copy(l.Labels, map[string]string{offload.LabelVirtualNode: "true", v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})
	l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	holder, duration := node.Name, int32(virtualNodeLeaseDuration/time.Second)
	renew := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &holder, &duration, &renew
	return l
}

// ownedBy reports whether l names node as its owner.
func ownedBy(l *coordinationv1.Lease, node *corev1.Node) bool {
	for _, o := range l.OwnerReferences {
		if o.Kind == "Node" && o.UID == node.UID {
			return true
		}
	}
	return false
}

// deleteLease deletes the Lease of provider id's virtual node, if it is
// ours; only when there may be one (known: a virtual node was just
// removed). The garbage collector deletes one this misses with its Node.
func (v *Nodes) deleteLease(ctx context.Context, id string, known bool) error {
	v.mu.Lock()
	last := v.leases[id]
	v.mu.Unlock()
	if last == nil && !known {
		return nil
	}
	name := offload.VirtualNodeName(id)
	leases := v.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("read the Lease of virtual node %s: %w", name, err)
	case !isOurVirtualNode(cur):
		v.log.Warn("a Lease named like a virtual node removed is not ours; left alone", "lease", corev1.NamespaceNodeLease+"/"+name)
	default:
		err := leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the Lease of virtual node %s: %w", name, err)
		}
		v.m.writes.WithLabelValues("delete").Inc()
	}
	v.mu.Lock()
	delete(v.leases, id)
	v.mu.Unlock()
	return nil
}
