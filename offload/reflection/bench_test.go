package reflection

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/test/busy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// BenchmarkReflectionLag: from a change to a local object (the update
// sent) to the provider's watch showing its effect, per kind, over
// FLOTILLA_BENCH_CHANGES changes one after the other (default 1000, 100
// with -short). Both clusters are real control planes; the Reflector
// runs with its default workers. Each kind runs quiet and with both
// cores kept busy (busy-loops=0 and 2, see test/busy). It prints per
// kind and level the median, p99, min and max.
//
//	go test ./offload/reflection -run '^$' -bench ReflectionLag -benchtime 1x
func BenchmarkReflectionLag(b *testing.B) {
	changes := benchChanges(b)
	// Each level of kindReferenced makes maxReferenced new ConfigMaps on
	// the provider: the grant's quota holds them all, beside the others.
	limits := offloadenv.ConsumerLimits
	limits.Fence.ConfigMaps = int64(len(busy.Levels(b, busy.EnvVar, busy.DefaultLevels))*maxReferenced + 10)
	e := newReflectEnvWith(b, 0, limits)
	ctx := b.Context()
	cms, secrets := e.Local.Client.CoreV1().ConfigMaps(e.ns), e.Local.Client.CoreV1().Secrets(e.ns)
	svcs, eps := e.Local.Client.CoreV1().Services(e.ns), e.Local.Client.DiscoveryV1().EndpointSlices(e.ns)
	remote := e.Provider.CP.Client

	cm, err := cms.Create(ctx, optIn("bench", map[string]string{"v": "-1"}), metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	secret, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bench", Annotations: map[string]string{offload.AnnotationReflect: "true"}},
		Data: map[string][]byte{"v": []byte("-1")}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "p", Port: 9999, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	slice, err := eps.Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "bench-1", Labels: map[string]string{discoveryv1.LabelServiceName: "bench", discoveryv1.LabelManagedBy: "bench"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{benchAddress(-1)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}

	kinds := []struct {
		kind   string
		watch  func(context.Context, metav1.ListOptions) (watch.Interface, error)
		marker func(runtime.Object) string
		change func(i int) (want string, err error)
		// prepare, when set, runs before each change, not timed.
		prepare func() error
	}{
		{kindConfigMap, remote.CoreV1().ConfigMaps(e.remote).Watch,
			func(o runtime.Object) string { return o.(*corev1.ConfigMap).Data["v"] },
			func(i int) (string, error) {
				cm.Data["v"] = strconv.Itoa(i)
				cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
				return strconv.Itoa(i), err
			}, nil},
		{kindSecret, remote.CoreV1().Secrets(e.remote).Watch,
			func(o runtime.Object) string { return string(o.(*corev1.Secret).Data["v"]) },
			func(i int) (string, error) {
				secret.Data["v"] = []byte(strconv.Itoa(i))
				secret, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
				return strconv.Itoa(i), err
			}, nil},
		{kindService, remote.CoreV1().Services(e.remote).Watch,
			func(o runtime.Object) string { return strconv.Itoa(int(o.(*corev1.Service).Spec.Ports[0].Port)) },
			func(i int) (string, error) {
				port := int32(10000 + i%50000)
				svc.Spec.Ports[0].Port = port
				svc, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
				return strconv.Itoa(int(port)), err
			}, nil},
		{kindEndpointSlice, remote.DiscoveryV1().EndpointSlices(e.remote).Watch,
			func(o runtime.Object) string {
				s := o.(*discoveryv1.EndpointSlice)
				if len(s.Endpoints) == 0 {
					return ""
				}
				return s.Endpoints[0].Addresses[0]
			},
			func(i int) (string, error) {
				slice.Endpoints[0].Addresses[0] = benchAddress(i)
				slice, err = eps.Update(ctx, slice, metav1.UpdateOptions{})
				a, _ := e.Views.AsSeenBy(e.Provider.ID, netip.MustParseAddr(benchAddress(i)))
				return a.String(), err
			}, nil},
	}
	// A ConfigMap reflected because a new pod bound to the virtual node
	// references it: from the pod's creation to the ConfigMap there.
	// Each round makes new ones: the ConfigMap first, not timed.
	pods := e.Local.Client.CoreV1().Pods(e.ns)
	seq := 0
	kinds = append(kinds, struct {
		kind    string
		watch   func(context.Context, metav1.ListOptions) (watch.Interface, error)
		marker  func(runtime.Object) string
		change  func(i int) (want string, err error)
		prepare func() error
	}{kindReferenced, remote.CoreV1().ConfigMaps(e.remote).Watch,
		func(o runtime.Object) string { return o.(*corev1.ConfigMap).Name },
		func(int) (string, error) {
			name := fmt.Sprintf("ref-%d", seq)
			_, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
				NodeName:    e.Node,
				Containers:  []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				Tolerations: []corev1.Toleration{{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists}},
				Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}},
			}}, metav1.CreateOptions{})
			return name, err
		},
		func() error {
			seq++
			_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ref-%d", seq)}}, metav1.CreateOptions{})
			return err
		}})
	for _, k := range kinds {
		b.Run(k.kind, func(b *testing.B) {
			// From any version: a watch from the latest waits for the
			// API server's cache of that kind to reach it, which, with
			// no other writes of the kind, takes seconds.
			opts := metav1.ListOptions{ResourceVersion: "0", FieldSelector: fields.OneTermEqualSelector("metadata.name", benchName(k.kind)).String()}
			if k.kind == kindReferenced {
				opts.FieldSelector = "" // a new name each time
			}
			w, err := k.watch(ctx, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer w.Stop()
			n := changes
			if k.kind == kindReferenced && n > maxReferenced {
				n = maxReferenced
			}
			busy.Run(b, func(b *testing.B) {
				var lags []time.Duration
				for b.Loop() {
					for i := range n {
						if k.prepare != nil {
							if err := k.prepare(); err != nil {
								b.Fatal(err)
							}
						}
						start := time.Now()
						want, err := k.change(i)
						if err != nil {
							b.Fatal(err)
						}
						waitMarker(b, w, k.marker, want)
						lags = append(lags, time.Since(start))
					}
				}
				b.StopTimer()
				reportLags(b, b.Name(), lags)
			})
		})
	}
}

// benchChanges is how many changes a lag benchmark times:
// FLOTILLA_BENCH_CHANGES, else 1000 (100 with -short).
func benchChanges(b *testing.B) int {
	changes := 1000
	if testing.Short() {
		changes = 100
	}
	if s := os.Getenv("FLOTILLA_BENCH_CHANGES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("FLOTILLA_BENCH_CHANGES=%q: want a count", s)
		}
		changes = n
	}
	return changes
}

// reportLags reports the median, p99, min and max of lags (at least one)
// as the benchmark's metrics, and logs them.
func reportLags(b *testing.B, what string, lags []time.Duration) {
	slices.Sort(lags)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p99 := lags[int(math.Ceil(0.99*float64(len(lags))))-1]
	b.ReportMetric(ms(harness.Median(lags)), "ms-median")
	b.ReportMetric(ms(p99), "ms-p99")
	b.ReportMetric(ms(lags[0]), "ms-min")
	b.ReportMetric(ms(lags[len(lags)-1]), "ms-max")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: %d changes: %v median, %v p99, %v min, %v max", what, len(lags), harness.Median(lags), p99, lags[0], lags[len(lags)-1])
}

// kindReferenced is the sub-benchmark of ConfigMaps reflected for a new
// pod that references them.
const kindReferenced = "ConfigMapReferencedByNewPod"

// maxReferenced bounds kindReferenced's changes at each busy level:
// each makes a new ConfigMap, and a pod, that stay, in the tenant's
// namespace, whose ConfigMap quota the benchmark sizes for them.
const maxReferenced = 190

func benchName(kind string) string {
	if kind == kindEndpointSlice {
		return "bench-1"
	}
	return "bench"
}

// benchAddress is the i-th address of a pod of the consumer's.
func benchAddress(i int) string {
	n := i + 2
	return fmt.Sprintf("10.244.%d.%d", n/250%250, n%250+1)
}

// waitMarker reads w until an object whose marker is want shows.
func waitMarker(b *testing.B, w watch.Interface, marker func(runtime.Object) string, want string) {
	timeout := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the provider's watch ended waiting for %s", want)
			}
			if ev.Type == watch.Error {
				b.Fatalf("the provider's watch failed waiting for %s: %v", want, ev.Object)
			}
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				if marker(ev.Object) == want {
					return
				}
			}
		case <-timeout:
			b.Fatalf("%s not reflected within a minute", want)
		}
	}
}
