package podsync

import (
	"context"
	"fmt"

	"github.com/flotilla-io/flotilla/offload"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Whose a remote pod is (docs/offload.md, "A provider back under a new
// identity"). A remote pod belongs to the consumer pod its origin names,
// so to the virtual node that pod is bound to (a pod's node never
// changes). Two Peers can reach the same namespace on the same API
// server, when a provider comes back under a new identity: each
// reflector then sees the other's pods, and the one whose virtual node a
// pod is not bound to must leave it alone, or the two delete and make it
// again without end.

// orphan handles remote, in pp's namespace for key, when no local pod
// bound to pp's virtual node stands for it: it is deleted when the
// consumer pod it stands for is gone, and left to the reflector of the
// virtual node that pod is bound to when it is not.
func (r *Reflector) orphan(ctx context.Context, pp *podProvider, key podKey, remote *corev1.Pod) error {
	if remote.Labels[offload.LabelProvider] == pp.id {
		// Made for our virtual node, whose pods our informer holds.
		return r.deleteRemote(ctx, pp, key, remote, nil)
	}
	// Made for another identity, or by a version that did not say
	// (unlabelled): the consumer pod it stands for decides.
	o, ok := originOfRemote(remote)
	if !ok {
		return nil // not ours (rn.pod checked it already)
	}
	if r.servedElsewhere(pp, key, o) {
		// That reflector deletes it when its pod goes; should it stop
		// first, we are queued again (queueSiblings).
		return nil
	}
	there, err := r.kube.Pods(key.namespace).Get(ctx, key.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		r.m.errors.WithLabelValues(pp.id, offload.ErrLocal).Inc()
		return fmt.Errorf("read pod %s/%s here, which pod %s/%s on %s stands for: %w", key.namespace, key.name, remote.Namespace, remote.Name, pp.id, err)
	case there.UID == o.uid && there.Spec.NodeName == pp.node:
		return nil // ours, and our informer is behind: its event follows
	case there.UID == o.uid:
		// Bound to a virtual node no reflector here serves (its Peer has
		// no credential any more): the pod goes with that node, and its
		// remote pod then; no event of ours says when.
		return offload.RetryLater(fmt.Sprintf("pod %s/%s on %s stands for pod %s/%s here, bound to node %s, which this agent no longer serves: left until that pod is gone",
			remote.Namespace, remote.Name, pp.id, key.namespace, key.name, there.Spec.NodeName))
	}
	// The consumer pod it stood for is gone: nobody else deletes it.
	return r.deleteRemote(ctx, pp, key, remote, nil)
}

// servedElsewhere reports whether the consumer pod of origin o is bound
// to the virtual node of another provider this reflector serves.
func (r *Reflector) servedElsewhere(pp *podProvider, key podKey, o origin) bool {
	for _, q := range r.providers.Snapshot() {
		if q == pp || !q.localSynced.Load() {
			continue
		}
		if local := q.localPod(key.namespace, key.name); local != nil && local.UID == o.uid {
			return true
		}
	}
	return false
}

// servedElsewhereFor reports whether remote, made for another identity
// than pp's, stands for a live local pod on that identity's virtual node.
func (r *Reflector) servedElsewhereFor(pp *podProvider, key podKey, remote *corev1.Pod) bool {
	if remote.Labels[offload.LabelProvider] == pp.id {
		return false
	}
	o, ok := originOfRemote(remote)
	return ok && r.servedElsewhere(pp, key, o)
}

// queueSiblings queues the pods of the providers served through the same
// API server and tenant as pp, which stopped: the remote pods they left
// to it are theirs to look at again.
func (r *Reflector) queueSiblings(pp *podProvider) {
	for _, q := range r.providers.Snapshot() {
		if q != pp && q.session.Server() == pp.session.Server() && q.session.TenantNamespace() == pp.session.TenantNamespace() {
			q.queueAll()
		}
	}
}
