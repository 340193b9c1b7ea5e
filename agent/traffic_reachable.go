package agent

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy"
)

// reachableServices is, per peer, what consumers opened to it here: a
// consumer that offloaded a namespace to this cluster and to that peer
// reflects the namespace's Services to both, and the peer's copies route
// straight to the consumer's pods running here (docs/services.md,
// "Endpoints on third clusters"). The consumer says so on the slices it
// reflects here (offload.AnnotationReachableFrom). Only addresses of
// pods in the slice's own namespace count: a consumer opens its own
// pods, never another tenant's or this cluster's.
func reachableServices(namespaces []corev1.Namespace, pods []corev1.Pod, eps []discoveryv1.EndpointSlice) map[string][]policy.Service {
	tenant := map[string]bool{}
	for _, ns := range namespaces {
		if ns.Labels[offload.LabelTenant] != "" && ns.Labels[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue {
			tenant[ns.Name] = true
		}
	}
	podsIn := map[string]map[netip.Addr]bool{}
	for _, p := range pods {
		if !tenant[p.Namespace] || p.Spec.HostNetwork {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				if podsIn[p.Namespace] == nil {
					podsIn[p.Namespace] = map[netip.Addr]bool{}
				}
				podsIn[p.Namespace][a] = true
			}
		}
	}
	out := map[string][]policy.Service{}
	for _, s := range eps {
		from := s.Annotations[offload.AnnotationReachableFrom]
		if from == "" || !tenant[s.Namespace] || s.Labels[offload.LabelReflected] != "true" {
			continue
		}
		svc := policy.Service{Name: s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && podsIn[s.Namespace][ip] {
					svc.Addresses = append(svc.Addresses, ip)
				}
			}
		}
		for _, p := range s.Ports {
			if port, ok := slicePort(p); ok {
				svc.Ports = append(svc.Ports, port)
			}
		}
		if len(svc.Addresses) == 0 || len(svc.Ports) == 0 {
			continue
		}
		for _, peer := range strings.Split(from, ",") {
			if peer = strings.TrimSpace(peer); peer != "" {
				out[peer] = append(out[peer], svc)
			}
		}
	}
	for _, svcs := range out {
		slices.SortFunc(svcs, func(a, b policy.Service) int { return strings.Compare(a.Name, b.Name) })
	}
	return out
}

// slicePort is an EndpointSlice port as policy takes it; a port without
// a number (all ports, which the slice API allows) is not opened.
func slicePort(p discoveryv1.EndpointPort) (policy.Port, bool) {
	if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
		return policy.Port{}, false
	}
	proto := policy.TCP
	if p.Protocol != nil {
		switch *p.Protocol {
		case corev1.ProtocolUDP:
			proto = policy.UDP
		case corev1.ProtocolSCTP:
			proto = policy.SCTP
		}
	}
	return policy.Port{Protocol: proto, Port: uint16(*p.Port)}, true
}
