package offload

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// Each side writes its own part of a Peer's status with server-side apply
// under a field manager of its own: the condition of its type and its half
// of status.offloading. The peering writer owns the rest, so no side
// removes what another wrote.
const (
	ProviderFieldOwner = "flotilla-offload-provider"
	ConsumerFieldOwner = "flotilla-offload-consumer"
)

// GrantCondition is one side's condition on a Peer and its half of
// status.offloading (nil: none).
type GrantCondition struct {
	Kind    string // v1alpha1.ConditionOffloadGranted or ConditionOffloadCredential
	OK      bool
	Reason  string
	Message string
	// Generation is the Peer spec the condition acted on (provider side).
	Generation int64
	Grant      *v1alpha1.GrantStatus
}

// ApplyGrantStatus writes c into the status of Peer id, keeping the
// transition time when the condition's status did not change (cur is the
// informer's copy, nil when unknown).
func ApplyGrantStatus(ctx context.Context, w client.Client, owner, id string, cur *v1alpha1.Peer, c GrantCondition, now time.Time) error {
	cond := metav1.Condition{
		Type: c.Kind, Status: metav1.ConditionFalse, Reason: c.Reason, Message: c.Message,
		ObservedGeneration: c.Generation, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
	}
	if c.OK {
		cond.Status = metav1.ConditionTrue
	}
	if cur != nil {
		if old := meta.FindStatusCondition(cur.Status.Conditions, c.Kind); old != nil && old.Status == cond.Status {
			cond.LastTransitionTime = old.LastTransitionTime
		}
	}
	var off v1alpha1.OffloadingStatus
	switch c.Kind {
	case v1alpha1.ConditionOffloadGranted:
		off.Granted = c.Grant
	default:
		off.Received = c.Grant
	}
	st := v1alpha1.PeerStatus{Conditions: []metav1.Condition{cond}}
	if off.Granted != nil || off.Received != nil {
		st.Offloading = &off
	}
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return fmt.Errorf("status of Peer %s: %w", id, err)
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Peer"))
	obj.SetName(id)
	obj.Object["status"] = status
	if err := w.Status().Patch(ctx, obj, client.Apply, client.FieldOwner(owner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply %s of Peer %s: %w", c.Kind, id, err)
	}
	return nil
}

// LimitsOf turns a Peer's limits into the grant's.
func LimitsOf(l *v1alpha1.OffloadLimits) grant.Limits {
	var g grant.Limits
	if l == nil {
		return g
	}
	if l.CPU != nil {
		g.CPU = l.CPU.String()
	}
	if l.Memory != nil {
		g.Memory = l.Memory.String()
	}
	if l.Pods != nil {
		g.Pods = *l.Pods
	}
	if l.Namespaces != nil {
		g.Namespaces = *l.Namespaces
	}
	f := &g.Fence
	for _, n := range []struct {
		from *int64
		to   *int64
	}{{l.Services, &f.Services}, {l.Secrets, &f.Secrets}, {l.ConfigMaps, &f.ConfigMaps}, {l.EndpointSlices, &f.EndpointSlices}, {l.PersistentVolumeClaims, &f.PersistentVolumeClaims}} {
		if n.from != nil {
			*n.to = *n.from
		}
	}
	if l.EphemeralStorage != nil {
		f.EphemeralStorage = l.EphemeralStorage.String()
	}
	f.AnyNamespaceName = l.NamespaceNames == v1alpha1.NamespaceNamesAny
	return g
}

// LimitsStatus is how a grant's limits show in a Peer's status; nil when
// there are none. Quantities that do not parse (a newer provider's) are
// left out.
func LimitsStatus(g grant.Limits) *v1alpha1.OffloadLimits {
	if g == (grant.Limits{}) {
		return nil
	}
	l := &v1alpha1.OffloadLimits{}
	if q, err := resource.ParseQuantity(g.CPU); err == nil && g.CPU != "" {
		l.CPU = &q
	}
	if q, err := resource.ParseQuantity(g.Memory); err == nil && g.Memory != "" {
		l.Memory = &q
	}
	if g.Pods > 0 {
		l.Pods = &g.Pods
	}
	if g.Namespaces > 0 {
		l.Namespaces = &g.Namespaces
	}
	f := g.Fence
	for _, n := range []struct {
		from int64
		to   **int64
	}{{f.Services, &l.Services}, {f.Secrets, &l.Secrets}, {f.ConfigMaps, &l.ConfigMaps}, {f.EndpointSlices, &l.EndpointSlices}, {f.PersistentVolumeClaims, &l.PersistentVolumeClaims}} {
		if n.from > 0 {
			v := n.from
			*n.to = &v
		}
	}
	if q, err := resource.ParseQuantity(f.EphemeralStorage); err == nil && f.EphemeralStorage != "" {
		l.EphemeralStorage = &q
	}
	if f.AnyNamespaceName {
		l.NamespaceNames = v1alpha1.NamespaceNamesAny
	}
	return l
}

// Shows reports whether peer's status already says c.
func Shows(peer *v1alpha1.Peer, c GrantCondition) bool {
	old := meta.FindStatusCondition(peer.Status.Conditions, c.Kind)
	if old == nil || (old.Status == metav1.ConditionTrue) != c.OK || old.Reason != c.Reason ||
		old.Message != c.Message || old.ObservedGeneration != c.Generation {
		return false
	}
	var have *v1alpha1.GrantStatus
	if o := peer.Status.Offloading; o != nil {
		have = o.Granted
		if c.Kind != v1alpha1.ConditionOffloadGranted {
			have = o.Received
		}
	}
	return reflect.DeepEqual(have, c.Grant)
}
