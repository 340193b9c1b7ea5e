package mirror

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/offload"
)

// Reasons of a cluster's Ready condition besides the provider's own
// (provider.go): ReasonNotGranted also when no credential is held,
// ReasonAlreadyExists also when the name is requested there for another
// local namespace, ReasonInvalidName also when the name cannot be made.
const (
	ReasonUnreachable = "Unreachable"
	// ReasonDuplicate: another NamespaceOffload in the namespace acts.
	ReasonDuplicate = "Duplicate"
	// ReasonDeleting: the namespace is being removed there.
	ReasonDeleting = "Deleting"
)

// clusterState is what one cluster's Ready condition says.
type clusterState struct {
	ok      bool
	reason  string
	message string
}

// reconcile brings namespace ns's requests on every provider and its
// NamespaceOffload's status in line.
func (mc *Consumer) reconcile(ctx context.Context, ns string) error {
	if err := mc.syncWatches(ctx); err != nil {
		mc.log.Debug("a provider watch did not start", "err", err)
	}
	var list v1alpha1.NamespaceOffloadList
	if err := mc.local.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
	}
	mc.forgetWritten(ns, list.Items)
	if len(list.Items) == 0 {
		// Requests left by a NamespaceOffload removed without us.
		mc.setPhase(ns, "")
		_, err := mc.removeRequests(ctx, ns)
		return err
	}
	items := list.Items
	slices.SortFunc(items, offload.CompareOffloads)
	// One being deleted while another lives hands its requests over to
	// the one acting.
	acting := offload.ActingOffload(items)
	var deleting []*v1alpha1.NamespaceOffload
	for i := range items {
		if o := &items[i]; o.DeletionTimestamp != nil {
			deleting = append(deleting, o)
		}
	}
	var errs []error
	if acting == nil {
		return mc.terminate(ctx, ns, deleting)
	}
	for _, o := range deleting {
		errs = append(errs, mc.removeFinalizer(ctx, o))
	}
	for i := range items {
		if o := &items[i]; o != acting && o.DeletionTimestamp == nil {
			errs = append(errs, mc.markDuplicate(ctx, o, acting))
		}
	}
	errs = append(errs, mc.offload(ctx, acting))
	return errors.Join(errs...)
}

// placement is the Placement condition of namespace ns: whether it
// carries LabelOffloaded=true, the placement webhook's namespaceSelector.
// Only an administrator sets that label (an admission policy refuses the
// agent): an agent that could would have its webhook see the pods of any
// namespace it chose. So the agent only says when it is missing.
func (mc *Consumer) placement(ctx context.Context, ns string, generation int64) (metav1.Condition, error) {
	var n corev1.Namespace
	if err := mc.local.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil && !apierrors.IsNotFound(err) {
		return metav1.Condition{}, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	c := metav1.Condition{Type: v1alpha1.ConditionPlacement, ObservedGeneration: generation,
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}
	if n.Labels[offload.LabelOffloaded] == "true" {
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonLabelled
		c.Message = fmt.Sprintf("namespace %s is labelled %s=true: the placement webhook places its new pods", ns, offload.LabelOffloaded)
		return c, nil
	}
	c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonNotLabelled
	c.Message = fmt.Sprintf("namespace %s lacks the label %s=true, which only an administrator sets (the agent may not): its new pods stay in this cluster. "+
		"`flotilla offload namespace %s` sets it, or `kubectl label namespace %s %s=true`", ns, offload.LabelOffloaded, ns, ns, offload.LabelOffloaded)
	return c, nil
}

// offload writes o's requests where its selector points, deletes the
// others, and sums up the answers in its status.
func (mc *Consumer) offload(ctx context.Context, o *v1alpha1.NamespaceOffload) error {
	// The finalizer goes on while the requests are written: the requests
	// of a NamespaceOffload removed without it are removed all the same
	// (reconcile, a namespace with none left).
	var finalized error
	var wg sync.WaitGroup
	var patched *v1alpha1.NamespaceOffload
	if !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerOffload) {
		patched = o.DeepCopy()
		controllerutil.AddFinalizer(patched, v1alpha1.FinalizerOffload)
		wg.Go(func() {
			if err := mc.write.Patch(ctx, patched, client.MergeFromWithOptions(o, client.MergeFromWithOptimisticLock{})); err != nil {
				finalized = fmt.Errorf("add the finalizer to NamespaceOffload %s/%s: %w", o.Namespace, o.Name, err)
			}
		})
	}

	ns := o.Namespace
	peers, err := mc.selectedPeers(ctx, o.Spec.ClusterSelector)
	if err != nil {
		wg.Wait()
		return errors.Join(err, finalized)
	}
	remote, nameErr := offload.RemoteNamespace(o.Spec.NamespaceMapping, ns, o.Spec.RemoteName, mc.cfg.Self)
	wanted := map[string]string{} // provider -> remote name
	var errs []error
	st := v1alpha1.NamespaceOffloadStatus{ObservedGeneration: o.Generation}
	for _, p := range peers {
		co := v1alpha1.ClusterOffload{ClusterID: p.Name, ClusterName: p.Status.ClusterName, RemoteNamespace: remote}
		var cs clusterState
		if nameErr != nil {
			co.RemoteNamespace = ""
			cs = clusterState{reason: ReasonInvalidName, message: fmt.Sprintf("no valid name for namespace %s on the providers: %v", ns, nameErr)}
		} else {
			wanted[p.Name] = remote
			cs, err = mc.ensureRequest(ctx, p.Name, clusterLabel(p), ns, remote)
			errs = append(errs, err)
		}
		co.Conditions = []metav1.Condition{cs.condition(o.Generation)}
		st.Clusters = append(st.Clusters, co)
	}
	errs = append(errs, mc.deleteUnwanted(ctx, ns, wanted))
	st.Phase = phaseOf(st.Clusters)
	if placed, err := mc.placement(ctx, ns, o.Generation); err == nil {
		st.Conditions = []metav1.Condition{placed}
	} else {
		errs = append(errs, err)
	}
	// The status after the finalizer: a status written first would change
	// the version that patch is conditional on.
	wg.Wait()
	if patched != nil && finalized == nil {
		// The status goes onto o as the finalizer left it.
		o.ResourceVersion, o.Finalizers = patched.ResourceVersion, patched.Finalizers
	}
	errs = append(errs, finalized, mc.writeStatus(ctx, o, st))
	mc.setPhase(ns, st.Phase)
	return errors.Join(errs...)
}

// ensureRequest makes the request for remote on provider say what it
// should, and tells where that provider stands.
func (mc *Consumer) ensureRequest(ctx context.Context, provider, name, ns, remote string) (clusterState, error) {
	_, g, err := mc.cfg.Credentials.Credential(provider)
	if err != nil {
		return clusterState{reason: ReasonNotGranted, message: err.Error()}, nil
	}
	w := mc.watches.get(provider)
	if w == nil {
		return clusterState{reason: ReasonUnreachable, message: fmt.Sprintf("no watch on %s's API server at %s yet (see the agent's log)", name, g.Server)}, nil
	}
	synced, werr := w.state()
	switch {
	case werr != nil:
		return clusterState{reason: ReasonUnreachable, message: fmt.Sprintf("%s's API server at %s: %v", name, w.server, werr)}, nil
	case !synced:
		return clusterState{reason: ReasonPending, message: fmt.Sprintf("listing this cluster's requests on %s", name)}, nil
	}
	want := &v1alpha1.NamespaceRequest{
		ObjectMeta: metav1.ObjectMeta{Name: remote, Namespace: w.namespace, Labels: map[string]string{v1alpha1.LabelMirroredFrom: ns}},
		Spec:       v1alpha1.NamespaceRequestSpec{SourceNamespace: ns},
	}
	r := w.request(remote)
	switch {
	case r == nil:
		err := w.client.Create(ctx, want)
		switch {
		case apierrors.IsAlreadyExists(err):
			// The watch is behind our own earlier write; its event follows.
			return clusterState{reason: ReasonPending, message: fmt.Sprintf("waiting for %s's agent to create namespace %s", name, remote)}, nil
		case err != nil:
			return clusterState{reason: ReasonUnreachable, message: fmt.Sprintf("request namespace %s on %s: %v", remote, name, err)},
				fmt.Errorf("create NamespaceRequest %s on %s: %w", remote, provider, err)
		}
		// As answerOf words it until the provider answers: the reconciles
		// that the request's own events bring write no new status.
		return clusterState{reason: ReasonPending, message: fmt.Sprintf("waiting for %s's agent to create namespace %s", name, remote)}, nil
	case r.Labels[v1alpha1.LabelMirroredFrom] != ns:
		other := r.Labels[v1alpha1.LabelMirroredFrom]
		if other == "" {
			other = r.Spec.SourceNamespace
		}
		return clusterState{reason: ReasonAlreadyExists, message: fmt.Sprintf(
			"namespace %s on %s is already requested for local namespace %s: choose another name (namespaceMapping, remoteName)", remote, name, other)}, nil
	case r.DeletionTimestamp != nil:
		return clusterState{reason: ReasonPending, message: fmt.Sprintf("%s is removing an earlier namespace %s; it is requested again once gone", name, remote)}, nil
	case r.Spec.SourceNamespace != ns:
		patched := r.DeepCopy()
		patched.Spec = want.Spec
		if err := w.client.Patch(ctx, patched, client.MergeFrom(r)); err != nil {
			return clusterState{reason: ReasonUnreachable, message: fmt.Sprintf("update the request for namespace %s on %s: %v", remote, name, err)},
				fmt.Errorf("update NamespaceRequest %s on %s: %w", remote, provider, err)
		}
		return clusterState{reason: ReasonPending, message: fmt.Sprintf("waiting for %s's agent to create namespace %s", name, remote)}, nil
	}
	return answerOf(r, name), nil
}

// answerOf is what the provider (named name) said of r.
func answerOf(r *v1alpha1.NamespaceRequest, name string) clusterState {
	s := r.Status
	if s.ObservedGeneration < r.Generation {
		return clusterState{reason: ReasonPending, message: fmt.Sprintf("waiting for %s's agent to create namespace %s", name, r.Name)}
	}
	switch s.Phase {
	case v1alpha1.RequestCreated:
		msg := s.Message
		if msg == "" {
			msg = fmt.Sprintf("namespace %s exists on %s with this cluster's rights", r.Name, name)
		}
		return clusterState{ok: true, reason: "Created", message: msg}
	case v1alpha1.RequestRefused:
		reason := s.Reason
		if reason == "" {
			reason = "Refused"
		}
		msg := s.Message
		if msg == "" {
			msg = fmt.Sprintf("%s refused namespace %s", name, r.Name)
		}
		return clusterState{reason: reason, message: msg}
	}
	msg := s.Message
	if msg == "" {
		msg = fmt.Sprintf("waiting for %s's agent to create namespace %s", name, r.Name)
	}
	return clusterState{reason: ReasonPending, message: msg}
}

// deleteUnwanted deletes the requests mirroring ns that are not wanted
// (a provider no longer selected, a name no longer chosen) on every
// provider watched and answering.
func (mc *Consumer) deleteUnwanted(ctx context.Context, ns string, wanted map[string]string) error {
	var errs []error
	for id, w := range mc.watches.all() {
		if synced, err := w.state(); !synced || err != nil {
			continue
		}
		for _, r := range w.requestsOf(ns) {
			if name, ok := wanted[id]; (ok && r.Name == name) || r.DeletionTimestamp != nil {
				continue
			}
			errs = append(errs, w.delete(ctx, r))
		}
	}
	return errors.Join(errs...)
}

func (w *providerWatch) delete(ctx context.Context, r *v1alpha1.NamespaceRequest) error {
	uid := r.UID
	err := w.client.Delete(ctx, r, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete NamespaceRequest %s on %s: %w", r.Name, w.provider, err)
	}
	w.log.Info("namespace request deleted", "request", r.Name, "source", r.Labels[v1alpha1.LabelMirroredFrom])
	return nil
}

// removeRequests deletes every request mirroring ns and reports, per
// provider, what is still there (nothing: every provider's watch answers
// and holds none). Providers whose credential is gone are not asked:
// revoking removed everything there.
func (mc *Consumer) removeRequests(ctx context.Context, ns string) (map[string]clusterState, error) {
	left := map[string]clusterState{}
	var errs []error
	for id, w := range mc.watches.all() {
		synced, werr := w.state()
		switch {
		case werr != nil:
			left[id] = clusterState{reason: ReasonUnreachable, message: fmt.Sprintf("the API server at %s: %v", w.server, werr)}
			continue
		case !synced:
			left[id] = clusterState{reason: ReasonPending, message: "listing this cluster's requests there"}
			continue
		}
		for _, r := range w.requestsOf(ns) {
			left[id] = clusterState{reason: ReasonDeleting, message: fmt.Sprintf("waiting for the provider to remove namespace %s", r.Name)}
			if r.DeletionTimestamp == nil {
				errs = append(errs, w.delete(ctx, r))
			}
		}
	}
	return left, errors.Join(errs...)
}

// terminate removes ns's requests everywhere, then the finalizers of the
// NamespaceOffloads being deleted.
func (mc *Consumer) terminate(ctx context.Context, ns string, deleting []*v1alpha1.NamespaceOffload) error {
	left, err := mc.removeRequests(ctx, ns)
	if err != nil {
		return err
	}
	if len(left) == 0 {
		var errs []error
		for _, o := range deleting {
			errs = append(errs, mc.removeFinalizer(ctx, o))
		}
		mc.setPhase(ns, "")
		return errors.Join(errs...)
	}
	o := deleting[0]
	if !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerOffload) {
		return nil // not ours to hold
	}
	st := v1alpha1.NamespaceOffloadStatus{Phase: v1alpha1.OffloadTerminating, ObservedGeneration: o.Generation}
	for _, id := range slices.Sorted(maps.Keys(left)) {
		co := v1alpha1.ClusterOffload{ClusterID: id, Conditions: []metav1.Condition{left[id].condition(o.Generation)}}
		var p v1alpha1.Peer
		if mc.local.Get(ctx, client.ObjectKey{Name: id}, &p) == nil {
			co.ClusterName = p.Status.ClusterName
		}
		if old := offload.FindCluster(o.Status.Clusters, id); old != nil {
			co.RemoteNamespace = old.RemoteNamespace
		}
		st.Clusters = append(st.Clusters, co)
	}
	mc.setPhase(ns, st.Phase)
	return mc.writeStatus(ctx, o, st)
}

func (mc *Consumer) removeFinalizer(ctx context.Context, o *v1alpha1.NamespaceOffload) error {
	if !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerOffload) {
		return nil
	}
	patched := o.DeepCopy()
	controllerutil.RemoveFinalizer(patched, v1alpha1.FinalizerOffload)
	err := mc.write.Patch(ctx, patched, client.MergeFromWithOptions(o, client.MergeFromWithOptimisticLock{}))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the finalizer of NamespaceOffload %s/%s: %w", o.Namespace, o.Name, err)
	}
	mc.log.Info("namespace no longer offloaded", "namespace", o.Namespace, "offload", o.Name)
	return nil
}

// markDuplicate says in o's status that acting, the oldest in the
// namespace, is the one followed.
func (mc *Consumer) markDuplicate(ctx context.Context, o, acting *v1alpha1.NamespaceOffload) error {
	peers, err := mc.selectedPeers(ctx, o.Spec.ClusterSelector)
	if err != nil {
		return err
	}
	st := v1alpha1.NamespaceOffloadStatus{Phase: v1alpha1.OffloadAllFailed, ObservedGeneration: o.Generation}
	if len(peers) == 0 {
		st.Phase = v1alpha1.OffloadNoClusterSelected
	}
	cs := clusterState{reason: ReasonDuplicate, message: fmt.Sprintf(
		"namespace %s is offloaded by NamespaceOffload %s, the oldest here; this one is ignored: delete it, or change %s",
		o.Namespace, acting.Name, acting.Name)}
	for _, p := range peers {
		st.Clusters = append(st.Clusters, v1alpha1.ClusterOffload{
			ClusterID: p.Name, ClusterName: p.Status.ClusterName, Conditions: []metav1.Condition{cs.condition(o.Generation)}})
	}
	return mc.writeStatus(ctx, o, st)
}

// selectedPeers are the Peers sel picks by the labels this cluster's
// admin gave them. An empty selector picks none: offloading goes only
// where someone chose. The peer's name label is left out of the match: the
// agent writes it from what the peer says of itself (as it writes the
// labels the peer announces into the status, not the labels).
func (mc *Consumer) selectedPeers(ctx context.Context, sel *metav1.LabelSelector) ([]v1alpha1.Peer, error) {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return nil, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, fmt.Errorf("spec.clusterSelector: %w", err)
	}
	var list v1alpha1.PeerList
	if err := mc.local.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list Peers: %w", err)
	}
	var out []v1alpha1.Peer
	for _, p := range list.Items {
		if identity.ValidateClusterID(p.Name) != nil || p.Name == mc.cfg.Self {
			continue
		}
		if s.Matches(selectable(p.Labels)) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b v1alpha1.Peer) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// selectable are the labels of a Peer a selector may match: all but the
// one the agent copies from the peer's own claim (its name).
func selectable(l map[string]string) labels.Set {
	out := make(labels.Set, len(l))
	for k, v := range l {
		if k != v1alpha1.LabelClusterName {
			out[k] = v
		}
	}
	return out
}

// clusterLabel names a peer in messages: its cluster name, else its ID.
func clusterLabel(p v1alpha1.Peer) string {
	if p.Status.ClusterName != "" {
		return p.Status.ClusterName
	}
	return p.Name
}

// phaseOf sums up the clusters: a final refusal or an unreachable
// provider counts as failed, Pending as in progress.
func phaseOf(clusters []v1alpha1.ClusterOffload) v1alpha1.OffloadPhase {
	if len(clusters) == 0 {
		return v1alpha1.OffloadNoClusterSelected
	}
	var ready, failed int
	for _, c := range clusters {
		cond := meta.FindStatusCondition(c.Conditions, offload.ConditionReady)
		switch {
		case cond == nil:
		case cond.Status == metav1.ConditionTrue:
			ready++
		case cond.Reason != ReasonPending:
			failed++
		}
	}
	switch {
	case failed == len(clusters):
		return v1alpha1.OffloadAllFailed
	case failed > 0:
		return v1alpha1.OffloadSomeFailed
	case ready == len(clusters):
		return v1alpha1.OffloadReady
	}
	return v1alpha1.OffloadInProgress
}

func (cs clusterState) condition(generation int64) metav1.Condition {
	c := metav1.Condition{
		Type: offload.ConditionReady, Status: metav1.ConditionFalse, Reason: cs.reason, Message: cs.message,
		ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second)),
	}
	if cs.ok {
		c.Status = metav1.ConditionTrue
	}
	return c
}

// writeStatus writes st into o's status when it says something new,
// keeping each condition's transition time while its status holds.
func (mc *Consumer) writeStatus(ctx context.Context, o *v1alpha1.NamespaceOffload, st v1alpha1.NamespaceOffloadStatus) error {
	for i := range st.Clusters {
		old := offload.FindCluster(o.Status.Clusters, st.Clusters[i].ClusterID)
		if old == nil {
			continue
		}
		for j := range st.Clusters[i].Conditions {
			c := &st.Clusters[i].Conditions[j]
			if oc := meta.FindStatusCondition(old.Conditions, c.Type); oc != nil && oc.Status == c.Status {
				c.LastTransitionTime = oc.LastTransitionTime
			}
		}
		// Conditions of other types are other controllers' (the
		// Reflector's Reflected): kept, or each write would undo theirs.
		for _, oc := range old.Conditions {
			if meta.FindStatusCondition(st.Clusters[i].Conditions, oc.Type) == nil {
				st.Clusters[i].Conditions = append(st.Clusters[i].Conditions, oc)
			}
		}
	}
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if oc := meta.FindStatusCondition(o.Status.Conditions, c.Type); oc != nil && oc.Status == c.Status {
			c.LastTransitionTime = oc.LastTransitionTime
		}
	}
	if reflect.DeepEqual(o.Status, st) {
		return nil
	}
	// o still at the version this controller last wrote its status onto,
	// with that status wanted again, is the cache from before that write.
	mc.mu.Lock()
	last, ok := mc.written[o.Namespace][o.UID]
	mc.mu.Unlock()
	if ok && last.from == o.ResourceVersion && sameStatus(last.status, st) {
		return nil
	}
	patched := o.DeepCopy()
	patched.Status = st
	if err := mc.write.Status().Patch(ctx, patched, client.MergeFrom(o)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("status of NamespaceOffload %s/%s: %w", o.Namespace, o.Name, err)
	}
	mc.mu.Lock()
	if mc.written[o.Namespace] == nil {
		mc.written[o.Namespace] = map[types.UID]writtenStatus{}
	}
	mc.written[o.Namespace][o.UID] = writtenStatus{from: o.ResourceVersion, status: *st.DeepCopy()}
	mc.mu.Unlock()
	return nil
}

// sameStatus compares two statuses but for their conditions' transition
// times.
func sameStatus(a, b v1alpha1.NamespaceOffloadStatus) bool {
	untimed := func(s v1alpha1.NamespaceOffloadStatus) v1alpha1.NamespaceOffloadStatus {
		s = *s.DeepCopy()
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		for i := range s.Clusters {
			for j := range s.Clusters[i].Conditions {
				s.Clusters[i].Conditions[j].LastTransitionTime = metav1.Time{}
			}
		}
		return s
	}
	return reflect.DeepEqual(untimed(a), untimed(b))
}

// forgetWritten forgets the statuses written to the NamespaceOffloads of
// namespace ns that are gone.
func (mc *Consumer) forgetWritten(ns string, offloads []v1alpha1.NamespaceOffload) {
	live := make(map[types.UID]bool, len(offloads))
	for _, o := range offloads {
		live[o.UID] = true
	}
	mc.mu.Lock()
	defer mc.mu.Unlock()
	maps.DeleteFunc(mc.written[ns], func(uid types.UID, _ writtenStatus) bool { return !live[uid] })
	if len(mc.written[ns]) == 0 {
		delete(mc.written, ns)
	}
}
