package kubeclient_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// An informer holds the objects its tweaked requests list, without their
// managed fields once DropManagedFields is its transform.
func TestInformerListsWhatItsTweakSelects(t *testing.T) {
	mine := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "ns", Labels: map[string]string{"app": "flotilla"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "flotilla"}}}}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "ns", Labels: map[string]string{"app": "other"}}}
	client := fake.NewClientset(mine, other)
	inf := kubeclient.NewInformer(&corev1.ConfigMap{}, client.CoreV1().ConfigMaps("ns"), func(o *metav1.ListOptions) {
		o.LabelSelector = "app=flotilla"
	})
	if err := inf.SetTransform(kubeclient.DropManagedFields); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer not synced")
	}
	if keys := inf.GetStore().ListKeys(); !slices.Equal(keys, []string{"ns/mine"}) {
		t.Fatalf("informer holds %v, want [ns/mine]", keys)
	}
	obj, _, _ := inf.GetStore().GetByKey("ns/mine")
	if mf := obj.(*corev1.ConfigMap).ManagedFields; mf != nil {
		t.Fatalf("managed fields kept: %v", mf)
	}
}
