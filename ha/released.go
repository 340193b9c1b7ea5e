package ha

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// watchReleased watches the Lease until ctx ends and signals released
// each time it sees it released (no holder) or gone: a standby tries to
// take it then, instead of at its next retry, up to a retry period later.
// A held Lease signals nothing: client-go's election alone decides when a
// held one has expired.
func watchReleased(ctx context.Context, kube kubeclient.Interface, namespace string, released chan<- struct{}) {
	byName := fields.OneTermEqualSelector("metadata.name", LeaseName).String()
	inf := kubeclient.NewInformer(&coordinationv1.Lease{}, kube.CoordinationV1().Leases(namespace),
		func(o *metav1.ListOptions) { o.FieldSelector = byName })
	signal := func() {
		select {
		case released <- struct{}{}:
		default:
		}
	}
	seen := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "") {
			signal()
		}
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(any) { signal() },
	})
	inf.RunWithContext(ctx)
}
