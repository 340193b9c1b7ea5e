package policyapi

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy"
)

// A consumer opens its own pods here to the peers its slices name, on the
// slices' ports; addresses of anything else it lists stay closed.
func TestReachableServices(t *testing.T) {
	tenantNS := func(name, tenant string) corev1.Namespace {
		return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			offload.LabelTenant: tenant, v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}}}
	}
	pod := func(ns, ip string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns}, Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}}}
	}
	port := func(n int32, proto corev1.Protocol) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Port: &n, Protocol: &proto}
	}
	slice := func(ns, svc, from string, reflected bool, addrs ...string) discoveryv1.EndpointSlice {
		s := discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc},
				Annotations: map[string]string{offload.AnnotationReachableFrom: from}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{port(8080, corev1.ProtocolTCP), port(53, corev1.ProtocolUDP)},
		}
		if reflected {
			s.Labels[offload.LabelReflected] = "true"
		}
		for _, a := range addrs {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
		}
		return s
	}
	in, problems := trafficInputOf(trafficObjects{
		Namespaces: []corev1.Namespace{tenantNS("a-shop", "a"), tenantNS("d-web", "d")},
		Pods:       []corev1.Pod{pod("a-shop", "10.0.1.5"), pod("d-web", "10.0.2.7"), pod("default", "10.0.3.3")},
		Slices: []discoveryv1.EndpointSlice{
			// a's own pod, and addresses that are not a's pods here:
			// another tenant's, this cluster's, a view of elsewhere.
			slice("a-shop", "far", "b, c", true, "10.0.1.5", "10.0.2.7", "10.0.3.3", "10.99.0.1"),
			// Not reflected by a consumer: someone else's annotation.
			slice("a-shop", "fake", "b", false, "10.0.1.5"),
			// Not a tenant namespace.
			slice("default", "svc", "b", true, "10.0.3.3"),
			// Nothing of a's own listed.
			slice("a-shop", "other", "b", true, "10.0.2.7"),
		},
	}, policy.Segregated)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	far := policy.Service{Name: "a-shop/far", Addresses: []netip.Addr{netip.MustParseAddr("10.0.1.5")},
		Ports: []policy.Port{{Protocol: policy.TCP, Port: 8080}, {Protocol: policy.UDP, Port: 53}}}
	want := map[string][]policy.Service{"b": {far}, "c": {far}}
	if !reflect.DeepEqual(in.Reflected, want) {
		t.Errorf("Reflected =\n%+v\nwant\n%+v", in.Reflected, want)
	}
	// And the consumer's pod stays open to the consumer itself.
	if got := in.Pods["a"]; len(got) != 1 || got[0] != netip.MustParseAddr("10.0.1.5") {
		t.Errorf("Pods[a] = %v, want a's pod", got)
	}
}
