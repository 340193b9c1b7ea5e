package reflection

import (
	"fmt"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

// BenchmarkThirdClusterEndpointsLag: from a change to a local endpoint on
// a third cluster B (the update sent) to the provider's translated slice
// showing the provider's view of it: the consumer's write of B's own
// address, then the provider agent's translation, over
// FLOTILLA_BENCH_CHANGES changes one after the other (default 1000, 100
// with -short). It prints the median, p99, min and max.
//
//	go test ./offload -run '^$' -bench ThirdClusterEndpointsLag -benchtime 1x
func BenchmarkThirdClusterEndpointsLag(b *testing.B) {
	changes := benchChanges(b)
	e := newThirdEnv(b)
	ctx := b.Context()
	if _, err := e.Local.Client.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "p", Port: 9999, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	eps := e.Local.Client.DiscoveryV1().EndpointSlices(e.ns)
	// i-th address of a pod on B: A's view, and P's.
	addr := func(i int) (consumer, provider string) {
		n := i + 2
		x, y := n/250%120, n%250+1
		return fmt.Sprintf("10.72.%d.%d", x, y), fmt.Sprintf("10.71.%d.%d", x, y)
	}
	first, _ := addr(-1)
	slice, err := eps.Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "bench-1", Labels: map[string]string{discoveryv1.LabelServiceName: "bench", discoveryv1.LabelManagedBy: "bench"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{first}, NodeName: offloadtest.Ptr(offload.VirtualNodeName(e.b))}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	opts := metav1.ListOptions{ResourceVersion: "0", FieldSelector: fields.OneTermEqualSelector("metadata.name", translatedSliceOf("bench-1", e.b)).String()}
	w, err := e.Provider.CP.Client.DiscoveryV1().EndpointSlices(e.remote).Watch(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	marker := func(o runtime.Object) string {
		s := o.(*discoveryv1.EndpointSlice)
		if len(s.Endpoints) == 0 {
			return ""
		}
		return s.Endpoints[0].Addresses[0]
	}
	var lags []time.Duration
	for b.Loop() {
		for i := range changes {
			start := time.Now()
			local, want := addr(i)
			slice.Endpoints[0].Addresses[0] = local
			if slice, err = eps.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
				b.Fatal(err)
			}
			waitMarker(b, w, marker, want)
			lags = append(lags, time.Since(start))
		}
	}
	b.StopTimer()
	reportLags(b, "third-cluster endpoints", lags)
}
