package offload

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// Each shared kind is told the same by its objects, its lists and its
// GroupVersionKind (GetInformerForKind routes by the last), and a
// metadata-only read of one (a PartialObjectMetadata) stays with the
// component's own cache, which may watch it with a transform of its own.
func TestSharedKindsAgree(t *testing.T) {
	scheme := sharedScheme()
	for _, tc := range []struct {
		obj  client.Object
		list client.ObjectList
		want SharedKind
	}{
		{&v1alpha1.NamespaceOffload{}, &v1alpha1.NamespaceOffloadList{}, SharedNamespaceOffloads},
		{&corev1.Namespace{}, &corev1.NamespaceList{}, SharedNamespaces},
		{&corev1.Service{}, &corev1.ServiceList{}, SharedServices},
		{&discoveryv1.EndpointSlice{}, &discoveryv1.EndpointSliceList{}, SharedEndpointSlices},
		{&mcsv1alpha1.ServiceExport{}, &mcsv1alpha1.ServiceExportList{}, SharedServiceExports},
	} {
		gvk, err := apiutil.GVKForObject(tc.obj, scheme)
		if err != nil {
			t.Fatal(err)
		}
		if got := []SharedKind{sharedKindOf(tc.obj), sharedKindOf(tc.list), sharedKindFor(gvk)}; got[0] != tc.want || got[1] != tc.want || got[2] != tc.want {
			t.Errorf("%s: object, list and kind say %v, want %v", gvk.Kind, got, tc.want)
		}
		if _, err := sharedMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			t.Errorf("%s: the shared cache does not know where it is served: %v", gvk.Kind, err)
		}
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if k := sharedKindOf(meta); k != 0 {
		t.Errorf("Namespaces as metadata read from the shared cache (%v)", k)
	}
	for _, obj := range []any{&corev1.Pod{}, &corev1.Node{}, &v1alpha1.Peer{}} {
		if k := sharedKindOf(obj); k != 0 {
			t.Errorf("%T read from the shared cache (%v)", obj, k)
		}
	}
}

// A read that waits for an informer to sync gives up once the cache it
// reads from has stopped, instead of waiting for ever: such a read made
// in an event handler held the handler, and with it the cache's stop.
// Neither cache here reaches an API server (nothing listens at its
// address), so no informer ever syncs; the read of a kind no informer
// watched before the stop makes one that is never started.
func TestCacheReadsGiveUpWhenTheCacheStops(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	shared, err := NewSharedCache(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	own, err := cache.New(cfg, cache.Options{Scheme: sharedScheme(), Mapper: sharedMapper()})
	if err != nil {
		t.Fatal(err)
	}
	wrapped := WithShared(own, shared, SharedServices)
	for _, c := range []struct {
		name  string
		cache interface {
			Start(context.Context) error
			client.Reader
		}
		list client.ObjectList
	}{
		{"shared cache, a shared kind", shared, &discoveryv1.EndpointSliceList{}},
		{"a component's cache, a kind of its own", wrapped, &v1alpha1.NamespaceOffloadList{}},
	} {
		ctx, stop := context.WithCancel(context.Background())
		started := make(chan error, 1)
		go func() { started <- c.cache.Start(ctx) }()
		stop()
		if err := <-started; err != nil {
			t.Fatalf("%s: start: %v", c.name, err)
		}
		read := make(chan error, 1)
		go func() { read <- c.cache.List(context.Background(), c.list) }()
		select {
		case err := <-read:
			if err == nil {
				t.Errorf("%s: a read after the stop returned no error, and no informer synced", c.name)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: a read after the stop still waits after a minute", c.name)
		}
	}
}

// Every read's context is bound to its cache's lifetime: it ends when
// the cache stops, its values kept, and the caller's own context, which
// may outlive the cache, is left running.
func TestLifetimeBoundsEveryContext(t *testing.T) {
	l := newLifetime()
	run, stop := context.WithCancel(context.Background())
	l.started(run)

	// A component's context, still running when the cache stops: the
	// agent stops its components one after another.
	own, cancelOwn := context.WithCancel(context.Background())
	defer cancelOwn()
	type key struct{}
	valued := context.WithValue(context.Background(), key{}, "v")
	bounded := map[string]context.Context{}
	for name, ctx := range map[string]context.Context{"Background": context.Background(), "a value of Background": valued, "a component's": own} {
		c, release := l.bound(ctx)
		defer release()
		if c.Err() != nil {
			t.Fatalf("%s: ended before the cache stopped: %v", name, c.Err())
		}
		bounded[name] = c
	}
	stop()
	for name, c := range bounded {
		select {
		case <-c.Done():
		case <-time.After(time.Minute):
			t.Fatalf("%s: not ended a minute after the cache stopped", name)
		}
	}
	if bounded["a value of Background"].Value(key{}) != "v" {
		t.Errorf("the value was lost")
	}
	if own.Err() != nil {
		t.Errorf("the caller's own context ended with the cache")
	}
}
