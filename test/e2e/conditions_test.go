package e2e

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/federation"
)

// waitCondition waits until c's Peer for peer has a condition of kind
// with reason, and returns that condition. It watches c's Peers instead
// of listing them again and again: on the two cores of the CI machine the
// API server and the agents under test have better use for the CPU.
func waitCondition(t testing.TB, c *federation.NodeCluster, peer, kind, reason string, timeout time.Duration) metav1.Condition {
	t.Helper()
	cw := watchConditions(t, c.Cluster)
	defer cw.stop()
	return cw.until(peer, kind, reason, timeout)
}

// conditionWatch follows a cluster's Peers from the moment it is made,
// as a watcher (`kubectl wait`, a controller) learns of a change: one
// List, then a watch from its resourceVersion. A test or benchmark that
// waits on it adds no polling of its own to the API server, which a
// benchmark measures.
type conditionWatch struct {
	t       testing.TB
	cluster string // the watched cluster's name, for messages
	w       *watchtools.RetryWatcher
	peers   map[string]*v1alpha1.Peer // by the peer's cluster name
}

// watchConditions starts following c's Peers, with a client of its own
// that can watch (c.Client cannot). The caller stops it when done.
func watchConditions(t testing.TB, c *federation.Cluster) *conditionWatch {
	t.Helper()
	cl, err := client.NewWithWatch(c.CP.Config, client.Options{Scheme: peerapi.Scheme()})
	if err != nil {
		t.Fatalf("watching client of %s: %v", c.Name, err)
	}
	ctx := context.Background()
	var list v1alpha1.PeerList
	if err := cl.List(ctx, &list); err != nil {
		t.Fatalf("Peers of %s: %v", c.Name, err)
	}
	cw := &conditionWatch{t: t, cluster: c.Name, peers: map[string]*v1alpha1.Peer{}}
	for i := range list.Items {
		cw.peers[list.Items[i].Status.ClusterName] = &list.Items[i]
	}
	lw := &toolscache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return cl.Watch(ctx, &v1alpha1.PeerList{}, &client.ListOptions{Raw: &opts})
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, lw)
	if err != nil {
		t.Fatalf("watch of Peers of %s: %v", c.Name, err)
	}
	cw.w = w
	return cw
}

// stop ends the watch and waits until it is gone.
func (cw *conditionWatch) stop() {
	cw.w.Stop()
	<-cw.w.Done()
}

// until waits until the Peer of the cluster named peer has condition kind
// with reason, and returns that condition. The test fails when timeout
// passes first or the watch ends.
func (cw *conditionWatch) until(peer, kind, reason string, timeout time.Duration) metav1.Condition {
	cw.t.Helper()
	deadline := time.After(timeout)
	for {
		var last *metav1.Condition
		if p := cw.peers[peer]; p != nil {
			if last = meta.FindStatusCondition(p.Status.Conditions, kind); last != nil && last.Reason == reason {
				return *last
			}
		}
		select {
		case <-deadline:
			cw.t.Fatalf("%s's Peer %s: condition %s is %+v after %s, want reason %s", cw.cluster, peer, kind, last, timeout, reason)
		case ev, ok := <-cw.w.ResultChan():
			if !ok {
				cw.t.Fatalf("%s's watch of Peers ended while Peer %s's condition %s was %+v, want reason %s", cw.cluster, peer, kind, last, reason)
			}
			switch p, isPeer := ev.Object.(*v1alpha1.Peer); {
			case ev.Type == watch.Error:
				cw.t.Fatalf("%s's watch of Peers failed while Peer %s's condition %s was %+v, want reason %s: %v",
					cw.cluster, peer, kind, last, reason, apierrors.FromObject(ev.Object))
			case !isPeer:
			case ev.Type == watch.Deleted:
				delete(cw.peers, p.Status.ClusterName)
			default:
				cw.peers[p.Status.ClusterName] = p
			}
		}
	}
}
