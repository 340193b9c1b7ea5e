package policyapi

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/policy"
)

// Whatever an EndpointSlice holds, what the feed makes of it is accepted
// by policy (nothing it lets through is refused there, which would stop
// every peer's decision), and every address is either kept or named.
func FuzzSliceService(f *testing.F) {
	f.Add("IPv4", "10.0.1.5,10.0.1.6", "TCP", int32(8080), true)
	f.Add("IPv4", "fd00::1,10.0.0.0", "UDP", int32(0), true)
	f.Add("IPv6", "fd00::1", "SCTP", int32(443), true)
	f.Add("IPv4", "224.0.0.1,255.255.255.255,0.0.0.0, 10.0.0.1", "quic", int32(-1), false)
	f.Add("FQDN", "example.com", "TCP", int32(70000), true)
	f.Fuzz(func(t *testing.T, addrType, addrs, proto string, port int32, numbered bool) {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s",
			Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}}, AddressType: discoveryv1.AddressType(addrType)}
		p := discoveryv1.EndpointPort{Protocol: (*corev1.Protocol)(&proto)}
		if numbered {
			p.Port = &port
		}
		es.Ports = []discoveryv1.EndpointPort{p}
		all := strings.Split(addrs, ",")
		es.Endpoints = []discoveryv1.Endpoint{{Addresses: all}}
		s, errs := sliceService(es)
		if _, err := policy.Decide([]policy.Peer{{ID: "p", Mode: policy.Segregated, Services: []policy.Service{s}}}); err != nil {
			t.Fatalf("policy refuses what the feed kept of %+v: %v", es, err)
		}
		if es.AddressType == discoveryv1.AddressTypeIPv4 {
			named := 0
			for _, err := range errs {
				if strings.HasPrefix(err.Error(), "address") {
					named++
				}
			}
			if len(s.Addresses)+named != len(all) {
				t.Errorf("%d addresses: %d kept, %d named (%v)", len(all), len(s.Addresses), named, errs)
			}
		}
	})
}
