package policyapi

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy"
)

// reachableServices adds to reflected, per peer, what consumers opened to
// it here: a consumer that offloaded a namespace to this cluster and to
// that peer reflects the namespace's Services to both, and the peer's
// copies route straight to the consumer's pods running here
// (docs/services.md, "Endpoints on third clusters"). The consumer says so
// on the slices it reflects here (offload.AnnotationReachableFrom). Only
// addresses of pods in the slice's own namespace count: a consumer opens
// its own pods, never another tenant's or this cluster's.
func reachableServices(objs trafficObjects, reflected map[string][]policy.Service, serviceOf func(*discoveryv1.EndpointSlice) policy.Service) {
	tenantOf := tenantNamespaces(objs.Namespaces)
	tenant := func(ns string) bool { return tenantOf[ns] != "" }
	podsIn := map[string]map[netip.Addr]bool{}
	for i := range objs.Pods {
		p := &objs.Pods[i]
		if !tenant(p.Namespace) || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
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
	for i := range objs.Slices {
		es := &objs.Slices[i]
		from := es.Annotations[offload.AnnotationReachableFrom]
		if from == "" || !tenant(es.Namespace) || es.Labels[offload.LabelReflected] != "true" {
			continue
		}
		svc := serviceOf(es)
		own := policy.Service{Name: svc.Name, Ports: svc.Ports}
		for _, a := range svc.Addresses {
			if podsIn[es.Namespace][a] {
				own.Addresses = append(own.Addresses, a)
			}
		}
		if len(own.Addresses) == 0 || len(own.Ports) == 0 {
			continue
		}
		for _, peer := range strings.Split(from, ",") {
			if peer = strings.TrimSpace(peer); peer != "" {
				reflected[peer] = append(reflected[peer], own)
			}
		}
	}
}
