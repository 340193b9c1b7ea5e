package policyapi

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/policy"
)

// trafficFieldOwner writes status.traffic and status.allowed of Peers with
// server-side apply, a field manager of its own: the peering writer and
// the offload sides own the rest of the status and keep it.
const trafficFieldOwner = "flotilla-traffic"

// trafficStatus is what a Peer's status says of its traffic: the mode in
// effect and, when Segregated, the size of its sets as applied.
func (f *Feed) trafficStatus(p *v1alpha1.Peer, in trafficInput) v1alpha1.PeerStatus {
	st := v1alpha1.PeerStatus{Traffic: v1alpha1.TrafficFull}
	if in.mode(p.Name) != policy.Segregated {
		return st
	}
	st.Traffic = v1alpha1.TrafficSegregated
	st.Allowed = &v1alpha1.TrafficAllowed{}
	// A Peer whose tunnel is not up yet has no sets applied: nothing
	// reaches here from it.
	if sets, ok := f.cfg.Dataplane.allowedSets(p.Name); ok {
		st.Allowed.Pods, st.Allowed.Services = int64(len(sets.Pods)), int64(len(sets.Services))
	}
	return st
}

// writeStatus brings every Peer's traffic status in line, writing only
// those that differ from what the informer holds.
func (f *Feed) writeStatus(ctx context.Context, peers []v1alpha1.Peer, in trafficInput) error {
	var errs []error
	for i := range peers {
		p := &peers[i]
		want := f.trafficStatus(p, in)
		if p.DeletionTimestamp != nil || (p.Status.Traffic == want.Traffic && equalAllowed(p.Status.Allowed, want.Allowed)) {
			continue
		}
		status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
		if err != nil {
			return fmt.Errorf("traffic status of Peer %s: %w", p.Name, err)
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"status": status}}
		obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Peer"))
		obj.SetName(p.Name)
		err = f.write.Status().Patch(ctx, obj, client.Apply, client.FieldOwner(trafficFieldOwner), client.ForceOwnership)
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("apply traffic status of Peer %s: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}

func equalAllowed(a, b *v1alpha1.TrafficAllowed) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
