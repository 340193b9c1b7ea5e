package ha

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// watchLease watches the Lease until ctx ends, for a standby (me).
//
// It signals released each time it sees the Lease released (no holder)
// or gone: the standby tries to take it then, instead of at its next
// retry, up to a retry period later.
//
// And it sends the Lease on expired once a lease duration has passed,
// by this replica's clock, since it last saw the Lease change while
// another replica held it: the holder has not renewed it since. That is
// client-go's own rule, which it applies only at its tries, every retry
// period with jitter, counting from the try that first read the last
// renewal: up to two retry periods and more later than the watch, which
// delivers each renewal as it is written. The Lease sent is the one last
// seen; taking it (Elector.takeExpired) is an update conditional on its
// resourceVersion, so a renewal this watch has not delivered yet wins.
//
// hb, when not nil, is told the Lease at each change (Heartbeat.leaseSeen).
func watchLease(ctx context.Context, kube kubeclient.Interface, namespace, me string, leaseDuration time.Duration, hb *Heartbeat, released chan<- struct{}, expired chan<- expiry) {
	inf := kubeclient.NewInformer(&coordinationv1.Lease{}, kube.CoordinationV1().Leases(namespace), kubeclient.ByName(LeaseName))
	signal := func() {
		select {
		case released <- struct{}{}:
		default:
		}
	}
	var (
		mu    sync.Mutex
		timer *time.Timer // fires a lease duration after the last change seen
	)
	stopTimer := func() {
		mu.Lock()
		defer mu.Unlock()
		if timer != nil {
			timer.Stop()
		}
	}
	defer stopTimer()
	seen := func(obj any) {
		l, ok := obj.(*coordinationv1.Lease)
		if !ok {
			return
		}
		stopTimer()
		if hb != nil {
			hb.leaseSeen(l.DeepCopy(), time.Now())
		}
		switch holder := l.Spec.HolderIdentity; {
		case holder == nil || *holder == "":
			signal()
			return
		case *holder == me:
			return
		}
		l = l.DeepCopy()
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(leaseDuration, func() {
			select {
			case expired <- expiry{lease: l, why: "the Lease was not renewed for a lease duration: took it"}:
			case <-ctx.Done():
			}
		})
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: seen,
		UpdateFunc: func(old, obj any) {
			// A resync delivers the Lease unchanged: no renewal.
			if o, ok := old.(*coordinationv1.Lease); ok && o.ResourceVersion == obj.(*coordinationv1.Lease).ResourceVersion {
				return
			}
			seen(obj)
		},
		DeleteFunc: func(any) { stopTimer(); signal() },
	})
	inf.RunWithContext(ctx)
}
