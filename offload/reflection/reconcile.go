package reflection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// newObject is an empty object of kind.
func newObject(kind string) client.Object {
	switch kind {
	case kindConfigMap:
		return &corev1.ConfigMap{}
	case kindSecret:
		return &corev1.Secret{}
	case kindService:
		return &corev1.Service{}
	case kindEndpointSlice:
		return &discoveryv1.EndpointSlice{}
	}
	return nil
}

// reconcile brings one local object's reflection on one provider in
// line; wrote says it changed something there.
func (r *Reflector) reconcile(ctx context.Context, key reflectKey) (wrote bool, err error) {
	pp := r.provider(key.provider)
	if pp == nil {
		return false, nil // no credential from it: what is there stays
	}
	if key.kind == kindStatus {
		return false, r.reconcileStatus(ctx, pp, key.namespace)
	}
	remoteNS := pp.remoteNamespace(key.namespace)
	rc := pp.cacheOf(remoteNS)
	switch {
	case remoteNS == "":
		// Not mirrored and ready there: what is there goes with the
		// namespace.
		return false, nil
	case rc == nil:
		return false, offload.ErrNotListed // queued once it is
	}
	want, dropped, err := r.desired(ctx, key, remoteNS)
	if err != nil {
		return false, err
	}
	current := newObject(key.kind)
	switch err := rc.Get(ctx, client.ObjectKey{Namespace: remoteNS, Name: key.name}, current); {
	case apierrors.IsNotFound(err):
		current = nil
	case err != nil:
		return false, fmt.Errorf("read %s %s/%s of %s: %w", key.kind, remoteNS, key.name, pp.id, err)
	}
	if current != nil {
		if ns, name, ok := reflectedOrigin(current); !ok || ns != key.namespace || name != key.name {
			current = nil // not ours, whatever the cache says: never touched
		}
	}
	switch {
	case want == nil && current == nil:
		r.setForeign(key, false)
		return false, nil
	case want == nil:
		r.setForeign(key, false)
		return r.deleteRemote(ctx, pp, key, current)
	case current == nil:
		return r.createRemote(ctx, pp, key, want, dropped)
	}
	updated, changed := merged(current, want)
	if !changed {
		return false, nil
	}
	err = pp.client.Update(ctx, updated, client.FieldOwner(reflectFieldManager))
	switch {
	case err == nil:
		r.countDropped(pp.id, dropped)
		return true, nil
	case apierrors.IsInvalid(err):
		// An immutable field changed (an immutable ConfigMap's data, a
		// Service turned headless): ours, so it goes and comes back.
		if _, err := r.deleteRemote(ctx, pp, key, current); err != nil {
			return false, err
		}
		return true, offload.RetryLater(fmt.Sprintf("%s %s/%s on %s changed what cannot be updated: deleted, made again once gone", key.kind, remoteNS, key.name, pp.id))
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return false, offload.RetryLater(fmt.Sprintf("update %s %s/%s on %s: the watch is behind: %v", key.kind, remoteNS, key.name, pp.id, err))
	}
	return false, r.failed(pp, key, "update", err)
}

// desired is what should stand for key's local object in remoteNS; nil
// when nothing should. dropped counts the endpoints left out of a slice.
func (r *Reflector) desired(ctx context.Context, key reflectKey, remoteNS string) (client.Object, map[string]int, error) {
	local := newObject(key.kind)
	read := r.local.Get
	if key.kind == kindConfigMap || key.kind == kindSecret {
		read = r.objects.Get
	}
	switch err := read(ctx, client.ObjectKey{Namespace: key.namespace, Name: key.name}, local); {
	case errors.Is(err, offload.ErrNotListed):
		return nil, nil, err
	case apierrors.IsNotFound(err):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("read %s %s/%s here: %w", key.kind, key.namespace, key.name, err)
	}
	// Reflected here by another cluster: never sent on.
	if local.GetDeletionTimestamp() != nil || local.GetLabels()[offload.LabelReflected] == "true" {
		return nil, nil, nil
	}
	switch l := local.(type) {
	case *corev1.ConfigMap:
		if l.Name == rootCAConfigMap {
			return nil, nil, nil
		}
		if ok, err := r.wanted(ctx, key, l); !ok || err != nil {
			return nil, nil, err
		}
		return reflectedConfigMap(l, remoteNS), nil, nil
	case *corev1.Secret:
		if isServiceAccountToken(l) {
			return nil, nil, nil
		}
		if ok, err := r.wanted(ctx, key, l); !ok || err != nil {
			return nil, nil, err
		}
		return reflectedSecret(l, remoteNS), nil, nil
	case *corev1.Service:
		if !ReflectsService(l) {
			return nil, nil, nil
		}
		return reflectedService(l, remoteNS), nil, nil
	case *discoveryv1.EndpointSlice:
		svc := l.Labels[discoveryv1.LabelServiceName]
		if !ReflectsSlice(l) {
			return nil, nil, nil
		}
		var s corev1.Service
		switch err := r.local.Get(ctx, client.ObjectKey{Namespace: key.namespace, Name: svc}, &s); {
		case apierrors.IsNotFound(err):
			return nil, nil, nil // goes with its Service
		case err != nil:
			return nil, nil, fmt.Errorf("read Service %s/%s here: %w", key.namespace, svc, err)
		}
		want, dropped := reflectedSlice(l, remoteNS, endpointTranslator{provider: key.provider, views: r.cfg.Views})
		if others := r.otherProviders(key.namespace, key.provider); len(others) > 0 {
			want.Annotations[offload.AnnotationReachableFrom] = strings.Join(others, ",")
		}
		return want, dropped, nil
	}
	return nil, nil, nil
}

// wanted reports whether a ConfigMap or Secret goes to key's provider:
// it opted in, or a pod bound to the provider's virtual node needs it.
func (r *Reflector) wanted(ctx context.Context, key reflectKey, local client.Object) (bool, error) {
	if local.GetAnnotations()[offload.AnnotationReflect] == "true" {
		return true, nil
	}
	pods, err := r.pods.ByIndex(podRefsIndex, podRefKey(key.provider, key.kind, key.namespace+"/"+key.name))
	if err != nil {
		return false, fmt.Errorf("list the pods referencing %s %s/%s: %w", key.kind, key.namespace, key.name, err)
	}
	return len(pods) > 0, nil
}

// merged is current with what want says (labels, annotations, content),
// and whether that changes anything; what the provider allocated (a
// Service's ClusterIP) is kept.
func merged(current, want client.Object) (client.Object, bool) {
	u := current.DeepCopyObject().(client.Object)
	changed := !maps.Equal(u.GetLabels(), want.GetLabels()) || !maps.Equal(u.GetAnnotations(), want.GetAnnotations())
	u.SetLabels(want.GetLabels())
	u.SetAnnotations(want.GetAnnotations())
	eq := apiequality.Semantic.DeepEqual
	switch w := want.(type) {
	case *corev1.ConfigMap:
		c := u.(*corev1.ConfigMap)
		changed = changed || !eq(c.Data, w.Data) || !eq(c.BinaryData, w.BinaryData) || !eq(c.Immutable, w.Immutable)
		c.Data, c.BinaryData, c.Immutable = w.Data, w.BinaryData, w.Immutable
	case *corev1.Secret:
		c := u.(*corev1.Secret)
		changed = changed || !eq(c.Data, w.Data) || c.Type != w.Type || !eq(c.Immutable, w.Immutable)
		c.Data, c.Type, c.Immutable, c.StringData = w.Data, w.Type, w.Immutable, nil
	case *corev1.Service:
		c := u.(*corev1.Service)
		headless := func(s *corev1.Service) bool { return s.Spec.ClusterIP == corev1.ClusterIPNone }
		changed = changed || c.Spec.Type != w.Spec.Type || headless(c) != headless(w) ||
			!eq(c.Spec.Ports, w.Spec.Ports) || c.Spec.ExternalName != w.Spec.ExternalName ||
			c.Spec.SessionAffinity != w.Spec.SessionAffinity || !eq(c.Spec.SessionAffinityConfig, w.Spec.SessionAffinityConfig) ||
			c.Spec.PublishNotReadyAddresses != w.Spec.PublishNotReadyAddresses || len(c.Spec.Selector) > 0
		c.Spec.Type, c.Spec.Ports, c.Spec.ExternalName, c.Spec.Selector = w.Spec.Type, w.Spec.Ports, w.Spec.ExternalName, nil
		c.Spec.SessionAffinity, c.Spec.SessionAffinityConfig = w.Spec.SessionAffinity, w.Spec.SessionAffinityConfig
		c.Spec.PublishNotReadyAddresses = w.Spec.PublishNotReadyAddresses
		if headless(w) {
			c.Spec.ClusterIP, c.Spec.ClusterIPs = corev1.ClusterIPNone, nil
		}
	case *discoveryv1.EndpointSlice:
		c := u.(*discoveryv1.EndpointSlice)
		changed = changed || c.AddressType != w.AddressType || !eq(c.Endpoints, w.Endpoints) || !eq(c.Ports, w.Ports)
		c.AddressType, c.Endpoints, c.Ports = w.AddressType, w.Endpoints, w.Ports
	}
	return u, changed
}

// createRemote creates want on the provider; a foreign object of its
// name is left alone and said so.
func (r *Reflector) createRemote(ctx context.Context, pp *reflectProvider, key reflectKey, want client.Object, dropped map[string]int) (bool, error) {
	err := pp.client.Create(ctx, want, client.FieldOwner(reflectFieldManager))
	switch {
	case err == nil:
		r.setForeign(key, false)
		r.countDropped(pp.id, dropped)
		return true, nil
	case !apierrors.IsAlreadyExists(err):
		return false, r.failed(pp, key, "create", err)
	}
	there := newObject(key.kind)
	switch err := pp.client.Get(ctx, client.ObjectKeyFromObject(want), there); {
	case apierrors.IsNotFound(err):
		return false, offload.RetryLater(fmt.Sprintf("create %s %s/%s on %s: it existed, then not: retrying", key.kind, want.GetNamespace(), want.GetName(), pp.id))
	case err != nil:
		return false, r.failed(pp, key, "read", err)
	}
	if ns, name, ok := reflectedOrigin(there); ok && ns == key.namespace && name == key.name {
		return false, offload.RetryLater(fmt.Sprintf("%s %s/%s on %s is ours and the watch is behind", key.kind, want.GetNamespace(), want.GetName(), pp.id))
	}
	if r.setForeign(key, true) {
		r.m.errors.WithLabelValues(key.kind, pp.id, offload.ErrNameTaken).Inc()
	}
	// No event says when it goes (the watch sees only ours): looked at
	// again after the backoff.
	return false, offload.RetryLater(fmt.Sprintf("%s %s/%s on %s is not this cluster's (no %s label and %s annotation): left alone",
		key.kind, want.GetNamespace(), want.GetName(), pp.id, offload.LabelReflected, offload.AnnotationOrigin))
}

// deleteRemote deletes current, the very object read (UID
// precondition).
func (r *Reflector) deleteRemote(ctx context.Context, pp *reflectProvider, key reflectKey, current client.Object) (bool, error) {
	uid := current.GetUID()
	err := pp.client.Delete(ctx, current, client.Preconditions{UID: &uid})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return false, nil // gone already
	}
	return false, r.failed(pp, key, "delete", err)
}

// failed counts a provider's failure and says what it was.
func (r *Reflector) failed(pp *reflectProvider, key reflectKey, verb string, err error) error {
	reason := offload.Classify(err)
	r.m.errors.WithLabelValues(key.kind, pp.id, reason).Inc()
	return &offload.ProviderError{Reason: reason, Err: fmt.Errorf("%s %s %s/%s on %s: %w", verb, key.kind, key.namespace, key.name, pp.id, err)}
}

func (r *Reflector) countDropped(provider string, dropped map[string]int) {
	for reason, n := range dropped {
		r.m.dropped.WithLabelValues(provider, reason).Add(float64(n))
	}
}

// setForeign records whether a foreign object stands in the way of key
// and, when that changes, queues its namespace's condition; it reports
// the change.
func (r *Reflector) setForeign(key reflectKey, foreign bool) bool {
	at := nsOnProvider{key.provider, key.namespace}
	what := key.kind + " " + key.name
	r.stateMu.Lock()
	was := r.foreign[at][what]
	switch {
	case foreign && !was:
		if r.foreign[at] == nil {
			r.foreign[at] = map[string]bool{}
		}
		r.foreign[at][what] = true
	case !foreign && was:
		delete(r.foreign[at], what)
		if len(r.foreign[at]) == 0 {
			delete(r.foreign, at)
		}
	}
	r.stateMu.Unlock()
	if foreign != was {
		r.queue.Add(reflectKey{provider: key.provider, kind: kindStatus, namespace: key.namespace})
	}
	return foreign != was
}

// reconcileStatus writes the Reflected condition of namespace ns's
// NamespaceOffloads for pp: whether foreign objects stand in the way.
func (r *Reflector) reconcileStatus(ctx context.Context, pp *reflectProvider, ns string) error {
	remoteNS := pp.remoteNamespace(ns)
	if remoteNS == "" || pp.cacheOf(remoteNS) == nil {
		return nil
	}
	r.stateMu.Lock()
	foreign := slices.Sorted(maps.Keys(r.foreign[nsOnProvider{pp.id, ns}]))
	r.stateMu.Unlock()
	cond := metav1.Condition{Type: v1alpha1.ConditionReflected, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReflected,
		Message: fmt.Sprintf("what the namespace's offloaded pods need is reflected to namespace %s on %s", remoteNS, pp.id)}
	switch refused := r.objects.forbidden(ns); {
	case refused != "":
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.ReasonForbidden
		cond.Message = r.objects.forbiddenMessage(ns, remoteNS, pp.id, refused)
	case len(foreign) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.ReasonForeignObject
		cond.Message = fmt.Sprintf("not reflected to namespace %s on %s: %s: objects of these names there are not this cluster's (no %s=true label and %s annotation) and are left alone; rename them here or remove them there",
			remoteNS, pp.id, strings.Join(foreign, ", "), offload.LabelReflected, offload.AnnotationOrigin)
	}
	var list v1alpha1.NamespaceOffloadList
	if err := r.local.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
	}
	var errs []error
	for i := range list.Items {
		o := &list.Items[i]
		c := offload.FindCluster(o.Status.Clusters, pp.id)
		if o.DeletionTimestamp != nil || c == nil || c.RemoteNamespace != remoteNS {
			continue
		}
		errs = append(errs, r.writeCondition(ctx, o, pp.id, cond))
	}
	return errors.Join(errs...)
}

// writeCondition applies cond to o's entry for provider, with the
// Reflector's own field manager: the mirror controller owns the rest of
// the status and keeps conditions of types it does not write.
func (r *Reflector) writeCondition(ctx context.Context, o *v1alpha1.NamespaceOffload, provider string, cond metav1.Condition) error {
	c := offload.FindCluster(o.Status.Clusters, provider)
	old := meta.FindStatusCondition(c.Conditions, cond.Type)
	if old != nil && old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message {
		return nil
	}
	cond.ObservedGeneration = o.Generation
	cond.LastTransitionTime = metav1.NewTime(time.Now().Truncate(time.Second))
	if old != nil && old.Status == cond.Status {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	cu, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "NamespaceOffload",
		"metadata": map[string]any{"name": o.Name, "namespace": o.Namespace, "uid": string(o.UID)},
		"status": map[string]any{"clusters": []any{
			map[string]any{"clusterID": provider, "conditions": []any{cu}},
		}},
	}}
	// Server-side apply on the status subresource: client.Apply is what
	// controller-runtime offers for subresources.
	err = r.write.Status().Patch(ctx, u, client.Apply, client.FieldOwner(reflectFieldManager), client.ForceOwnership)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("condition %s of NamespaceOffload %s/%s for %s: %w", cond.Type, o.Namespace, o.Name, provider, err)
	}
	return nil
}

// counts is how many reflected objects of each kind the cache holds.
func (rc *remoteCache) counts() map[string]int {
	out := map[string]int{}
	lists := map[string]client.ObjectList{
		kindConfigMap: &corev1.ConfigMapList{}, kindSecret: &corev1.SecretList{},
		kindService: &corev1.ServiceList{}, kindEndpointSlice: &discoveryv1.EndpointSliceList{},
	}
	for kind, l := range lists {
		if err := rc.List(context.Background(), l); err == nil {
			out[kind] = meta.LenList(l)
		}
	}
	return out
}
