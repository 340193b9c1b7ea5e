package policyapi

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/tunnel"
)

// BenchmarkTrafficFeedLatency: a pod of a consumer starts here (the
// write of its status with its IP, as its kubelet's) until the data plane
// is handed the consumer's sets with it, while the cluster exports 10,000 service endpoints (100 slices
// of 100) that every Segregated peer's sets hold: the API server's write
// and watch, the feed's debounce and a decision over everything. The
// kernel's part comes after (tunnel's BenchmarkPolicyUpdate). Prints the
// median, min and max in milliseconds.
//
//	go test ./policy/policyapi -run '^$' -bench TrafficFeedLatency -benchtime 21x
func BenchmarkTrafficFeedLatency(b *testing.B) {
	const slicesN, perSlice = 100, 100
	e := newTrafficEnv(b, nil, policy.Segregated)
	e.create(peerObject("b", ""), peerObject("p", ""), tenantNamespace("flotilla-tenant-b", "b"), namespaceObject("web", nil))
	e.service("web", "front", 443, 8443, "10.1.0.1")
	tcp, port := corev1.ProtocolTCP, int32(8443)
	for i := range slicesN {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: fmt.Sprintf("front-big-%d", i),
			Labels: map[string]string{discoveryv1.LabelServiceName: "front", discoveryv1.LabelManagedBy: "test"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: &port, Protocol: &tcp}}}
		for j := range perSlice {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.2.%d.%d", i, j+1)}})
		}
		e.create(es)
	}
	e.create(&mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}})
	e.run()
	total := slicesN*perSlice + 1
	eventually.Within(b, time.Minute, "every peer's sets hold the exported endpoints", func() error {
		s := e.dp.sets("b")
		if s == nil {
			return fmt.Errorf("b not Segregated")
		}
		if len(s.Services) != total {
			return fmt.Errorf("b's sets hold %d endpoints", len(s.Services))
		}
		return nil
	})

	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		ip := netip.AddrFrom4([4]byte{10, 0, byte(i / 250), byte(i%250 + 1)})
		b.StopTimer()
		// Created, then decided on (no address yet) and quiet again: what
		// is timed is the address given, as a kubelet gives it.
		p := e.newPod("flotilla-tenant-b", fmt.Sprintf("pod-%d", i))
		time.Sleep(2 * DefaultDebounce)
		b.StartTimer()
		start := time.Now()
		e.startPod(p, ip.String())
		for s := e.dp.sets("b"); s == nil || !slices.Contains(s.Pods, ip); s = e.dp.sets("b") {
			if time.Since(start) > 30*time.Second {
				b.Fatalf("pod %s not in b's sets after 30s", ip)
			}
			time.Sleep(100 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(lat[len(lat)/2]), "median-ms")
	b.ReportMetric(ms(lat[0]), "min-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(float64(total), "endpoints")
	if c := histogramCount(b, e.reg, "flotilla_policy_update_latency_seconds"); c == 0 {
		b.Errorf("no latency observed")
	}
}

// BenchmarkTrafficDecision: what one decision of the feed costs in CPU,
// from the objects to the sets handed to the data plane, with 10,000 pods
// of a consumer and 10,000 exported endpoints (100 slices of 100), for
// two Segregated peers: every decision reads everything, so this is the
// price of each burst. Prints the median, min and max in milliseconds.
//
//	go test ./policy/policyapi -run '^$' -bench TrafficDecision -benchtime 21x
func BenchmarkTrafficDecision(b *testing.B) {
	objs := trafficObjects{
		Namespaces: []corev1.Namespace{*tenantNamespace("flotilla-tenant-b", "b")},
		Services:   []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}},
		Exports:    []mcsv1alpha1.ServiceExport{{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}},
	}
	for i := range 10000 {
		objs.Pods = append(objs.Pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "flotilla-tenant-b", Name: fmt.Sprint(i)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)}}}})
	}
	tcp, port := corev1.ProtocolTCP, int32(8443)
	for i := range 100 {
		es := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: fmt.Sprint(i),
			Labels: map[string]string{discoveryv1.LabelServiceName: "front"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: &port, Protocol: &tcp}}}
		for j := range 100 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.2.%d.%d", i, j+1)}})
		}
		objs.Slices = append(objs.Slices, es)
	}
	dp := &lastDataplane{}
	seg := NewSegregatingDataplane(dp, nil, nil)
	if err := seg.Apply(b.Context(), tunnel.Desired{Peers: []tunnel.Peer{{ClusterID: "b"}, {ClusterID: "p"}}}); err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	for i := 0; b.Loop(); i++ {
		// One pod more each time, so that every decision is applied.
		objs.Pods[i%len(objs.Pods)].Status.PodIPs[0].IP = fmt.Sprintf("10.1.%d.%d", i/250%250, i%250+1)
		start := time.Now()
		in, _ := trafficInputOf(objs, policy.Segregated)
		applied, err := seg.setInput(b.Context(), in)
		if err != nil || !applied {
			b.Fatalf("decision %d: %v, applied %v", i, err, applied)
		}
		took = append(took, time.Since(start))
	}
	if s := dp.sets("b"); s == nil || len(s.Pods) != 10000 || len(s.Services) != 10000 {
		b.Fatalf("b's sets: %v", s)
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(took[len(took)/2]), "median-ms")
	b.ReportMetric(ms(took[0]), "min-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
}
