package podsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// Event reasons on local pods.
const (
	EventProviderRefused = "ProviderRefused"
	EventNameTaken       = "NameTaken"
	EventWaiting         = "WaitingForNamespace"
	EventIPNotTranslated = "PodIPNotTranslated"
)

// mirrorState is how a local namespace stands on a provider.
type mirrorState int

const (
	notOffloaded mirrorState = iota
	mirrorWaiting
	mirrorReady
)

// placement is where a local namespace's pods go on a provider.
type placement struct {
	state  mirrorState
	remote string // the namespace there ("" when none is named)
	why    string // why not offloaded, or what it waits for
}

// reconcile brings one local pod and its remote pod in line, from what
// the informers hold.
func (r *Reflector) reconcile(ctx context.Context, key podKey) error {
	pp := r.provider(key.provider)
	if pp == nil {
		return nil // no credential from it: its pods are left as they are
	}
	if !pp.localSynced.Load() {
		return offload.ErrNotListed
	}
	local := pp.localPod(key.namespace, key.name)
	m, err := r.mirrorOf(ctx, key.namespace, key.provider)
	if err != nil {
		return err
	}
	rn := pp.namespace(m.remote)
	known := rn != nil && rn.synced.Load()
	var remote *corev1.Pod
	if known {
		remote = rn.pod(key)
	}
	switch {
	case local == nil:
		if remote != nil && remote.DeletionTimestamp == nil {
			// Deleted here while we did not look, or bound to another
			// virtual node whose Peer reaches the same namespace.
			return r.orphan(ctx, pp, key, remote)
		}
		return nil
	case local.DeletionTimestamp != nil:
		return r.finishDeletion(ctx, pp, key, local, m, remote, known)
	case terminal(local):
		if remote != nil && sameOrigin(remote, local) {
			return r.reflect(ctx, pp, key, local, remote)
		}
		return nil
	case m.state == notOffloaded && rn != nil && !known:
		return offload.ErrNotListed // it may be running there: look first
	case m.state == notOffloaded && (remote == nil || !sameOrigin(remote, local)):
		// Refused as a kubelet refuses at admission; one already
		// running there (its namespace turned Local) runs on.
		return r.refuse(ctx, pp, local, m.why)
	case !known:
		if m.state == mirrorWaiting {
			r.waiting(pp, local, m)
			return nil
		}
		return offload.ErrNotListed
	case remote == nil:
		if m.state != mirrorReady {
			r.waiting(pp, local, m)
			return nil
		}
		return r.create(ctx, pp, key, local, m.remote)
	case !sameOrigin(remote, local):
		// Left by an older pod of that name: it goes, then ours is made.
		// One standing for a live pod on another identity's node is
		// newer than ours, which our cache still holds: its event follows.
		if remote.DeletionTimestamp == nil && !r.servedElsewhereFor(pp, key, remote) {
			return r.deleteRemote(ctx, pp, key, remote, nil)
		}
		return nil
	case remote.DeletionTimestamp != nil:
		return nil // deleted there out of band: made again once gone
	}
	return r.reflect(ctx, pp, key, local, remote)
}

// mirrorOf is where namespace ns's pods go on provider, from the
// NamespaceOffloads' status: ready wins over waiting, which wins over not
// offloaded. A NamespaceOffload being deleted offloads nothing any more;
// one whose pods stay Local names its namespace there but offloads no
// new pod.
func (r *Reflector) mirrorOf(ctx context.Context, ns, provider string) (placement, error) {
	var list v1alpha1.NamespaceOffloadList
	if err := r.local.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return placement{}, fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
	}
	best := placement{state: notOffloaded, why: fmt.Sprintf("namespace %s has no NamespaceOffload", ns)}
	for i := range list.Items {
		o := &list.Items[i]
		if o.DeletionTimestamp != nil {
			if best.state == notOffloaded {
				best.why = fmt.Sprintf("namespace %s's NamespaceOffload %s is being deleted", ns, o.Name)
			}
			continue
		}
		name, ready := offload.MirroredNamespace(o, provider)
		var m placement
		switch {
		case o.Spec.PodOffloading == v1alpha1.PodsLocal:
			// Mirrored, but its pods stay here: the namespace there is
			// still watched for the pods that ran there before.
			m = placement{state: notOffloaded, remote: name, why: fmt.Sprintf("NamespaceOffload %s keeps its pods here (podOffloading %s)", o.Name, o.Spec.PodOffloading)}
		case ready:
			return placement{state: mirrorReady, remote: name}, nil
		case name != "":
			m = placement{state: mirrorWaiting, remote: name, why: readyMessage(o, provider)}
		case o.Status.ObservedGeneration < o.Generation:
			m = placement{state: mirrorWaiting, why: fmt.Sprintf("NamespaceOffload %s is not reconciled yet", o.Name)}
		default:
			m = placement{state: notOffloaded, why: fmt.Sprintf("NamespaceOffload %s does not offload it there", o.Name)}
			if c := offload.FindCluster(o.Status.Clusters, provider); c != nil {
				m.why += ": " + readyMessage(o, provider)
			}
		}
		if m.state > best.state || best.state == notOffloaded {
			best = m
		}
	}
	return best, nil
}

// readyMessage is what o's Ready condition says of provider.
func readyMessage(o *v1alpha1.NamespaceOffload, provider string) string {
	if c := offload.FindCluster(o.Status.Clusters, provider); c != nil {
		if cond := meta.FindStatusCondition(c.Conditions, offload.ConditionReady); cond != nil {
			return cond.Reason + ": " + cond.Message
		}
	}
	return "no status yet"
}

// sameOrigin reports whether remote stands for local itself, not for an
// older pod of that name.
func sameOrigin(remote, local *corev1.Pod) bool {
	o, ok := originOfRemote(remote)
	return ok && o.uid == local.UID
}

// create makes local's pod on the provider. The cache holds local
// without its spec (localPodTransform): the whole pod is read here, from
// etcd (a watch cache behind ours would not have it yet).
func (r *Reflector) create(ctx context.Context, pp *podProvider, key podKey, local *corev1.Pod, ns string) error {
	whole, err := r.kube.Pods(local.Namespace).Get(ctx, local.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil // deleted: its event follows
	case err != nil:
		r.m.errors.WithLabelValues(key.provider, offload.ErrLocal).Inc()
		return fmt.Errorf("read pod %s/%s here to make it on %s: %w", local.Namespace, local.Name, pp.id, err)
	case whole.UID != local.UID || whole.DeletionTimestamp != nil:
		return nil // replaced or being deleted since the cache had it: its event follows
	}
	_, err = pp.client.Pods(ns).Create(ctx, remotePod(whole, ns, pp.id), metav1.CreateOptions{FieldManager: podFieldManager})
	switch {
	case err == nil:
		r.acted(lagPod, key)
		return nil
	case apierrors.IsAlreadyExists(err):
		return r.nameTaken(ctx, pp, key, local, ns)
	}
	return r.providerFailed(pp, local, "create", key, err)
}

// nameTaken looks at the pod that holds local's name on the provider:
// ours, the watch is behind and its event follows; an older pod's of
// that name, it is deleted (then ours is made); anybody else's, it is
// left alone and the local pod says so.
func (r *Reflector) nameTaken(ctx context.Context, pp *podProvider, key podKey, local *corev1.Pod, ns string) error {
	there, err := pp.client.Pods(ns).Get(ctx, local.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return offload.RetryLater(fmt.Sprintf("create pod %s/%s on %s: it existed, then not: retrying", ns, local.Name, pp.id))
	case err != nil:
		return r.providerFailed(pp, local, "read", key, err)
	}
	if o, ok := originOfRemote(there); ok && o.namespace == key.namespace && o.name == key.name {
		if o.uid == local.UID {
			return nil
		}
		if r.servedElsewhereFor(pp, key, there) {
			return offload.RetryLater(fmt.Sprintf("pod %s/%s on %s stands for a newer pod of that name, on another identity's node: ours is gone, or made once that one is", ns, local.Name, pp.id))
		}
		if err := r.deleteRemote(ctx, pp, key, there, nil); err != nil {
			return err
		}
		return offload.RetryLater(fmt.Sprintf("pod %s/%s on %s stood for an older pod of that name: deleted, ours is made once it is gone", ns, local.Name, pp.id))
	}
	msg := fmt.Sprintf("a pod named %s exists in namespace %s on %s and is not this one's (no %s annotation naming it): it is left alone; rename the pod here or remove that one there",
		local.Name, ns, pp.id, offload.AnnotationOrigin)
	pp.recorder.Event(local, corev1.EventTypeWarning, EventNameTaken, msg)
	r.m.errors.WithLabelValues(pp.id, offload.ErrNameTaken).Inc()
	return errors.New(msg)
}

// deleteRemote deletes remote, the very pod read (UID precondition);
// grace is the local pod's grace period when it is being deleted.
func (r *Reflector) deleteRemote(ctx context.Context, pp *podProvider, key podKey, remote *corev1.Pod, grace *int64) error {
	uid := remote.UID
	err := pp.client.Pods(remote.Namespace).Delete(ctx, remote.Name, metav1.DeleteOptions{
		GracePeriodSeconds: grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case err == nil:
		r.acted(lagPod, key)
		pp.log.Debug("remote pod deleted", "pod", key.namespace+"/"+key.name, "remote", remote.Namespace+"/"+remote.Name)
		return nil
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone already (its event follows)
	}
	r.m.errors.WithLabelValues(pp.id, offload.Classify(err)).Inc()
	return &offload.ProviderError{Reason: offload.Classify(err), Err: fmt.Errorf("delete pod %s/%s on %s: %w", remote.Namespace, remote.Name, pp.id, err)}
}

// finishDeletion deletes local's remote pod with local's grace period
// and, once it is gone, local itself (with grace 0, as a kubelet confirms
// its containers stopped).
func (r *Reflector) finishDeletion(ctx context.Context, pp *podProvider, key podKey, local *corev1.Pod, m placement, remote *corev1.Pod, known bool) error {
	if known {
		if remote != nil {
			if remote.DeletionTimestamp == nil {
				return r.deleteRemote(ctx, pp, key, remote, local.DeletionGracePeriodSeconds)
			}
			return nil // its deletion event brings us back
		}
		return r.confirmDeletion(ctx, key, local)
	}
	if m.remote == "" {
		return r.confirmDeletion(ctx, key, local) // nothing was ever made there
	}
	// Not watched (the namespace is not ready there): ask the provider.
	there, err := pp.client.Pods(m.remote).Get(ctx, local.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		// Forbidden: no rights there any more, so no pod of ours.
		return r.confirmDeletion(ctx, key, local)
	case err != nil:
		r.m.errors.WithLabelValues(pp.id, offload.Classify(err)).Inc()
		return &offload.ProviderError{Reason: offload.Classify(err), Err: fmt.Errorf("read pod %s/%s on %s: %w", m.remote, local.Name, pp.id, err)}
	}
	if o, ok := originOfRemote(there); !ok || o.namespace != key.namespace || o.name != key.name {
		return r.confirmDeletion(ctx, key, local) // not ours
	}
	if there.DeletionTimestamp == nil {
		if err := r.deleteRemote(ctx, pp, key, there, local.DeletionGracePeriodSeconds); err != nil {
			return err
		}
	}
	return offload.RetryLater(fmt.Sprintf("pod %s/%s on %s is being deleted; the local pod goes once it is gone", m.remote, local.Name, pp.id))
}

// confirmDeletion removes local, the very pod read.
func (r *Reflector) confirmDeletion(ctx context.Context, key podKey, local *corev1.Pod) error {
	uid := local.UID
	err := r.kube.Pods(local.Namespace).Delete(ctx, local.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		r.m.errors.WithLabelValues(key.provider, offload.ErrLocal).Inc()
		return fmt.Errorf("delete pod %s/%s here: %w", local.Namespace, local.Name, err)
	}
	r.acted(lagPodStatus, key)
	return nil
}

// reflect writes remote's status, in this cluster's terms, on local.
func (r *Reflector) reflect(ctx context.Context, pp *podProvider, key podKey, local, remote *corev1.Pod) error {
	st, untranslated := reflectedStatus(local, remote, func(a netip.Addr) (netip.Addr, bool) { return r.cfg.Views.Translate(pp.id, a) }, r.cfg.Address)
	if apiequality.Semantic.DeepEqual(local.Status, st) {
		return nil
	}
	if len(untranslated) > 0 {
		r.m.errors.WithLabelValues(pp.id, offload.ErrUntranslatable).Inc()
		pp.recorder.Event(local, corev1.EventTypeWarning, EventIPNotTranslated, untranslatedMessage(pp.id, untranslated))
	}
	return r.writeStatus(ctx, key, local, st)
}

// writeStatus replaces local's status with st, the status alone: the
// cache holds local without its labels and annotations
// (localPodTransform), which an update of the whole pod would clear. The
// resource version read is the precondition, as an update's would be.
func (r *Reflector) writeStatus(ctx context.Context, key podKey, local *corev1.Pod, st corev1.PodStatus) error {
	patch, err := json.Marshal([]offload.PatchOp{
		{Op: "replace", Path: "/metadata/resourceVersion", Value: local.ResourceVersion},
		{Op: "replace", Path: "/status", Value: st},
	})
	if err != nil {
		return fmt.Errorf("write the status of pod %s/%s here: %w", local.Namespace, local.Name, err)
	}
	_, err = r.kube.Pods(local.Namespace).Patch(ctx, local.Name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: podFieldManager}, "status")
	switch {
	case err == nil:
		r.acted(lagPodStatus, key)
		return nil
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		// Our cache is behind; the newer pod's event follows.
		return fmt.Errorf("write the status of pod %s/%s here: %w", local.Namespace, local.Name, err)
	}
	r.m.errors.WithLabelValues(key.provider, offload.ErrLocal).Inc()
	return fmt.Errorf("write the status of pod %s/%s here: %w", local.Namespace, local.Name, err)
}

// refuse fails local, bound to the virtual node of a provider its
// namespace is not offloaded to, as a kubelet refuses a pod at admission.
func (r *Reflector) refuse(ctx context.Context, pp *podProvider, local *corev1.Pod, why string) error {
	msg := fmt.Sprintf("pod bound to virtual node %s, but namespace %s is not offloaded to %s (%s): offload the namespace there, or keep the pod off the virtual node",
		pp.node, local.Namespace, pp.id, why)
	key := podKey{provider: pp.id, namespace: local.Namespace, name: local.Name}
	if err := r.writeStatus(ctx, key, local, notOffloadedStatus(local, msg)); err != nil {
		return err
	}
	r.m.errors.WithLabelValues(pp.id, offload.ErrNotOffloaded).Inc()
	pp.recorder.Event(local, corev1.EventTypeWarning, ReasonNotOffloaded, msg)
	return nil
}

// waiting says on a pod not started yet what its namespace waits for on
// the provider.
func (r *Reflector) waiting(pp *podProvider, local *corev1.Pod, m placement) {
	if local.Status.Phase != corev1.PodPending && local.Status.Phase != "" {
		return
	}
	where := m.remote
	if where == "" {
		where = "its namespace"
	}
	pp.recorder.Eventf(local, corev1.EventTypeNormal, EventWaiting, "waiting for %s on %s: %s", where, pp.id, m.why)
}

// providerFailed counts a provider's failure and, when it refused the
// pod (rather than not answering), says so on local with its message.
func (r *Reflector) providerFailed(pp *podProvider, local *corev1.Pod, verb string, key podKey, err error) error {
	reason := offload.Classify(err)
	r.m.errors.WithLabelValues(pp.id, reason).Inc()
	if offload.Refused(reason) {
		msg := err.Error()
		if s, ok := err.(apierrors.APIStatus); ok && s.Status().Message != "" {
			msg = s.Status().Message
		}
		pp.recorder.Eventf(local, corev1.EventTypeWarning, EventProviderRefused, "%s refused the pod (%s); retrying: %s", pp.id, reason, msg)
	}
	return &offload.ProviderError{Reason: reason, Err: fmt.Errorf("%s pod %s/%s on %s: %w", verb, key.namespace, key.name, pp.id, err)}
}
