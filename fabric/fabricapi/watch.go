package fabricapi

import (
	"context"
	"errors"
	"fmt"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// ErrNoPlan is what Watch reports while the ConfigMap does not exist.
var ErrNoPlan = errors.New("no fabric plan published")

// Watch calls changed with the plan in namespace whenever it changes, with
// ErrNoPlan while there is none and a parse error for a plan it cannot
// use, until ctx ends. It watches that one ConfigMap and nothing else.
func Watch(ctx context.Context, client kubeclient.Interface, namespace string, changed func(Plan, error)) error {
	inf := kubeclient.NewInformer(&corev1.ConfigMap{}, client.CoreV1().ConfigMaps(namespace), kubeclient.ByName(PlanName))
	report := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		data, ok := cm.Data[PlanKey]
		if !ok {
			changed(Plan{}, fmt.Errorf("ConfigMap %s/%s has no %s", namespace, PlanName, PlanKey))
			return
		}
		plan, err := ParsePlan([]byte(data))
		changed(plan, err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    report,
		UpdateFunc: func(_, cur any) { report(cur) },
		DeleteFunc: func(any) { changed(Plan{}, ErrNoPlan) },
	}); err != nil {
		return fmt.Errorf("watch ConfigMap %s/%s: %w", namespace, PlanName, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	if len(inf.GetStore().List()) == 0 {
		changed(Plan{}, ErrNoPlan)
	}
	<-ctx.Done()
	return nil
}

// WatchLease calls changed with the identity of the replica holding the
// Lease name in namespace whenever it changes ("" while none holds it or
// there is no such Lease), until ctx ends. It watches that one Lease.
func WatchLease(ctx context.Context, client kubeclient.Interface, namespace, name string, changed func(holder string)) error {
	inf := kubeclient.NewInformer(&coordinationv1.Lease{}, client.CoordinationV1().Leases(namespace), kubeclient.ByName(name))
	var last *string
	report := func(holder string) {
		if last == nil || *last != holder {
			last = &holder
			changed(holder)
		}
	}
	holderOf := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok {
			report(ptr.Deref(l.Spec.HolderIdentity, ""))
		}
	}
	// One informer delivers its events in order, from one goroutine.
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    holderOf,
		UpdateFunc: func(_, cur any) { holderOf(cur) },
		DeleteFunc: func(any) { report("") },
	}); err != nil {
		return fmt.Errorf("watch Lease %s/%s: %w", namespace, name, err)
	}
	inf.RunWithContext(ctx)
	return nil
}

// Uninstalling reports whether the fabric is being removed from the
// cluster rather than restarted on this node: its DaemonSet is gone or
// being deleted, or the fabric's service account lost its rights (the
// namespace is going). A pod that stops for any other reason (an update,
// a node drain) leaves the routes in place, so traffic keeps flowing.
func Uninstalling(ctx context.Context, client kubeclient.Interface, namespace string) (bool, error) {
	ds, err := client.AppsV1().DaemonSets(namespace).Get(ctx, DaemonSetName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read DaemonSet %s/%s: %w", namespace, DaemonSetName, err)
	}
	return ds.DeletionTimestamp != nil, nil
}
