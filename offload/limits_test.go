package offload

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// What the admin sets on a Peer reaches the provider's fence, and shows
// again in its status as set.
func TestLimitsOfCarriesTheFence(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	storage := resource.MustParse("10Gi")
	spec := &v1alpha1.OffloadLimits{
		Pods: n(5), Namespaces: n(3), NamespaceNames: v1alpha1.NamespaceNamesAny,
		Services: n(7), Secrets: n(8), ConfigMaps: n(9), EndpointSlices: n(10), PersistentVolumeClaims: n(11), EphemeralStorage: &storage,
	}
	want := grant.Limits{Pods: 5, Namespaces: 3, Fence: grant.Fence{
		Services: 7, Secrets: 8, ConfigMaps: 9, EndpointSlices: 10, PersistentVolumeClaims: 11, EphemeralStorage: "10Gi", AnyNamespaceName: true,
	}}
	got := LimitsOf(spec)
	if got != want {
		t.Fatalf("LimitsOf = %+v, want %+v", got, want)
	}
	if back := LimitsStatus(got); !reflect.DeepEqual(back, spec) {
		t.Errorf("LimitsStatus(LimitsOf(spec)) = %+v, want the spec %+v", back, spec)
	}
	if got := LimitsOf(&v1alpha1.OffloadLimits{NamespaceNames: v1alpha1.NamespaceNamesSuffixed}); got.Fence.AnyNamespaceName {
		t.Error("namespaceNames Suffixed allows any name")
	}
}
