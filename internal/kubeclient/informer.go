package kubeclient

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// ListWatcher is a typed client of one kind (CoreV1().Pods(ns), ...).
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewInformer is an informer of the objects like obj that c lists and
// watches, with tweak (when not nil) applied to every request, as an
// informer factory's is made, without linking every kind a factory knows.
// Run it with RunWithContext, which returns when ctx ends and its
// goroutines have stopped.
func NewInformer[L runtime.Object](obj runtime.Object, c ListWatcher[L], tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	opts := func(o metav1.ListOptions) metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return o
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, opts(o))
		},
	}
	return cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// DropManagedFields is an informer's transform that drops the managed
// fields of what it caches: nothing here reads them, and they are often
// the larger part of a small object.
func DropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// ByName is NewInformer's tweak for one object, name, by a field
// selector: what a Role limited to that name (resourceNames) lets its
// holder list and watch.
func ByName(name string) func(*metav1.ListOptions) {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	return func(o *metav1.ListOptions) { o.FieldSelector = selector }
}
