package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// reservedPrefixes and reservedNames are namespaces no consumer may have
// mirrored, whatever it asks: the cluster's own, Flotilla's (tenants and
// the agent's) and OpenShift's.
var (
	reservedPrefixes = []string{"kube-", "flotilla-", "openshift-"}
	reservedNames    = []string{"default", "kube-system", "kube-public", "kube-node-lease"}
)

// ReservedNamespace reports whether name may never be mirrored here.
func ReservedNamespace(name, agentNamespace string) bool {
	if name == agentNamespace || slices.Contains(reservedNames, name) {
		return true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// MirroredFor reports whether ns is a namespace mirrored for consumer from
// source: only such a namespace is ever written or deleted for a request.
func MirroredFor(ns *corev1.Namespace, consumer, source string) bool {
	l := ns.Labels
	return l[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue && l[offload.LabelTenant] == consumer &&
		l[v1alpha1.LabelMirroredFrom] == source && ns.Name != offload.TenantNamespace(consumer)
}

// ErrNotOurs is a namespace of the requested name that is not mirrored
// for that consumer from that source.
var ErrNotOurs = errors.New("namespace exists and is not mirrored for this consumer from this namespace")

// EnsureMirrored makes the namespace name mirrored for consumer from
// source, with the consumer's RoleBinding and the grant's quota, or checks
// that the one of that name is. Like the tenant's, it never applies to a
// namespace that exists: that would adopt one created in between. known is
// the namespace the caller already read and found mirrored for consumer
// from source (nil: none), so it is not read again. fence is its
// NetworkPolicy FencePolicy as applied.
func (t *Tenants) EnsureMirrored(ctx context.Context, consumer, name, source string, limits grant.Limits, known *corev1.Namespace) (ns *corev1.Namespace, fence Fence, created bool, err error) {
	hard, err := quotaOf(limits)
	if err != nil {
		return nil, Fence{}, false, fmt.Errorf("mirror namespace %s for %s: %w", name, consumer, err)
	}
	networks, err := t.allowedEndpoints(ctx, limits.Fence.EndpointNetworks)
	if err != nil {
		return nil, Fence{}, false, fmt.Errorf("mirror namespace %s for %s: %w", name, consumer, err)
	}
	ns = known
	if ns == nil {
		defer t.warmFence(ctx)()
		if ns, created, err = t.createMirrored(ctx, consumer, name, source, networks); err != nil {
			return nil, Fence{}, false, err
		}
	}
	if !created {
		if ns, err = t.fenceNamespace(ctx, ns, networks); err != nil {
			return nil, Fence{}, false, fmt.Errorf("mirror namespace %s for %s: %w", name, consumer, err)
		}
	}
	if fence, err = t.applyGrantObjects(ctx, consumer, name, hard, created); err != nil {
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			err = fmt.Errorf("%w: %w", ErrTerminating, err)
		}
		return nil, Fence{}, created, fmt.Errorf("mirror namespace %s for %s: %w", name, consumer, err)
	}
	return ns, fence, created, nil
}

// createMirrored creates the namespace, or, when one of that name exists
// (created in between), reads it and checks it is the consumer's. Create
// comes first: the caller has just found none.
func (t *Tenants) createMirrored(ctx context.Context, consumer, name, source, networks string) (*corev1.Namespace, bool, error) {
	for range 2 {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: namespaceLabels(offload.MirroredLabels(consumer, source)),
			Annotations: map[string]string{AnnotationEndpointNetworks: networks}}}
		ns, err := t.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{FieldManager: TenantFieldManager})
		if err == nil {
			return ns, true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, fmt.Errorf("create namespace %s: %w", name, err)
		}
		ns, err = t.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted in between: create it again
		}
		if err != nil {
			return nil, false, fmt.Errorf("read namespace %s: %w", name, err)
		}
		if !MirroredFor(ns, consumer, source) {
			return nil, false, fmt.Errorf("namespace %s (labels %s=%q, %s=%q): %w", name,
				offload.LabelTenant, ns.Labels[offload.LabelTenant], v1alpha1.LabelMirroredFrom, ns.Labels[v1alpha1.LabelMirroredFrom], ErrNotOurs)
		}
		if ns.DeletionTimestamp != nil {
			return nil, false, fmt.Errorf("namespace %s: %w; it is created again once gone", name, ErrTerminating)
		}
		return ns, false, nil
	}
	return nil, false, fmt.Errorf("create namespace %s: created and deleted by someone else while we tried; retry", name)
}

// DeleteMirrored deletes ns, the very object read (UID precondition): a
// namespace of that name made since is not touched.
func (t *Tenants) DeleteMirrored(ctx context.Context, ns *corev1.Namespace) error {
	if ns.DeletionTimestamp != nil {
		return nil
	}
	err := t.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(ns.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete mirrored namespace %s: %w", ns.Name, err)
	}
	t.forgetFence(ns.Name)
	return nil
}

// removeMirrored deletes every namespace mirrored for consumer.
func (t *Tenants) removeMirrored(ctx context.Context, consumer string) error {
	sel := offload.MirroredSelector(consumer).String()
	list, err := t.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("list mirrored namespaces (%s): %w", sel, err)
	}
	var errs []error
	for i := range list.Items {
		ns := &list.Items[i]
		if ns.Name == offload.TenantNamespace(consumer) {
			continue
		}
		if ns.DeletionTimestamp == nil {
			t.log.Info("mirrored namespace removed with its tenant", "consumer", consumer, "namespace", ns.Name)
		}
		errs = append(errs, t.DeleteMirrored(ctx, ns))
	}
	return errors.Join(errs...)
}

// releaseRequests takes FinalizerRequest off the consumer's requests once
// their namespaces are being deleted, so that its tenant namespace goes
// even when no mirroring controller runs. A cluster without the CRD has
// none.
func (t *Tenants) releaseRequests(ctx context.Context, consumer string) error {
	ns := offload.TenantNamespace(consumer)
	list, err := t.requests.Namespace(ns).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list NamespaceRequests in %s: %w", ns, err)
	}
	var errs []error
	for _, r := range list.Items {
		if err := t.releaseRequest(ctx, &r); err != nil {
			errs = append(errs, fmt.Errorf("release NamespaceRequest %s/%s: %w", ns, r.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// releaseRequest takes FinalizerRequest off r, reading it again when the
// mirroring controller wrote it meanwhile.
func (t *Tenants) releaseRequest(ctx context.Context, r *unstructured.Unstructured) error {
	requests := t.requests.Namespace(r.GetNamespace())
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		fins := r.GetFinalizers()
		if !slices.Contains(fins, v1alpha1.FinalizerRequest) {
			return nil
		}
		patch, err := finalizersPatch(r.GetResourceVersion(), slices.DeleteFunc(slices.Clone(fins), func(f string) bool { return f == v1alpha1.FinalizerRequest }))
		if err != nil {
			return err
		}
		_, err = requests.Patch(ctx, r.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: TenantFieldManager})
		if apierrors.IsConflict(err) {
			got, gerr := requests.Get(ctx, r.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			*r = *got
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// finalizersPatch sets an object's finalizers, if it is still at
// resourceVersion (a merge patch replaces the whole list).
func finalizersPatch(resourceVersion string, finalizers []string) ([]byte, error) {
	if finalizers == nil {
		finalizers = []string{}
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": resourceVersion, "finalizers": finalizers}})
}
