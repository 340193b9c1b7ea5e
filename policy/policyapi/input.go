package policyapi

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/offload/reflection"
	"github.com/flotilla-io/flotilla/policy"
)

// trafficObjects are the Kubernetes objects the traffic policy follows,
// as the feed's informers hold them.
type trafficObjects struct {
	Namespaces []corev1.Namespace
	Pods       []corev1.Pod
	Services   []corev1.Service
	Slices     []discoveryv1.EndpointSlice
	Offloads   []v1alpha1.NamespaceOffload
	Exports    []mcsv1alpha1.ServiceExport
	Peers      []v1alpha1.Peer
}

// inputProblem is part of an object that cannot be enforced and is left
// out of the sets (so that traffic to it is dropped from a Segregated
// peer), the rest of the object and every other object kept.
type inputProblem struct {
	Object string // "Pod ns/name", "EndpointSlice ns/name"
	Err    error
}

// trafficInputOf turns objects into policy's input: a pure function, so
// that every rule is tested without an API server.
func trafficInputOf(objs trafficObjects, def policy.Mode) (trafficInput, []inputProblem) {
	in := trafficInput{Default: def, Modes: map[string]policy.Mode{}, Reflected: map[string][]policy.Service{}}
	for i := range objs.Peers {
		in.Modes[objs.Peers[i].Name] = trafficMode(&objs.Peers[i], def)
	}
	var problems []inputProblem
	in.Pods, problems = offloadedPods(objs.Namespaces, objs.Pods)

	services := map[nsName]*corev1.Service{}
	for i := range objs.Services {
		s := &objs.Services[i]
		services[nsName{s.Namespace, s.Name}] = s
	}
	slicesOf := map[nsName][]*discoveryv1.EndpointSlice{}
	for i := range objs.Slices {
		es := &objs.Slices[i]
		if svc := es.Labels[discoveryv1.LabelServiceName]; svc != "" {
			k := nsName{es.Namespace, svc}
			slicesOf[k] = append(slicesOf[k], es)
		}
	}
	// Each slice is converted once, whoever it is allowed to.
	converted := map[*discoveryv1.EndpointSlice]policy.Service{}
	serviceOf := func(es *discoveryv1.EndpointSlice) policy.Service {
		if s, ok := converted[es]; ok {
			return s
		}
		s, errs := sliceService(es)
		for _, err := range errs {
			problems = append(problems, inputProblem{Object: "EndpointSlice " + es.Namespace + "/" + es.Name, Err: err})
		}
		converted[es] = s
		return s
	}

	// Consumer side: what reflection.Reflector reflects to each provider.
	byNamespace := map[string][]*corev1.Service{}
	for _, s := range services {
		byNamespace[s.Namespace] = append(byNamespace[s.Namespace], s)
	}
	for provider, namespaces := range reflection.ReflectedNamespaces(objs.Offloads) {
		for _, ns := range namespaces {
			for _, svc := range byNamespace[ns] {
				if !reflection.ReflectsService(svc) {
					continue
				}
				for _, es := range slicesOf[nsName{svc.Namespace, svc.Name}] {
					if reflection.ReflectsSlice(es) {
						in.Reflected[provider] = append(in.Reflected[provider], serviceOf(es))
					}
				}
			}
		}
	}
	// Provider side: what consumers opened to their other providers.
	reachableServices(objs, in.Reflected, serviceOf)
	// What this cluster exports goes to every peer.
	for i := range objs.Exports {
		se := &objs.Exports[i]
		svc := services[nsName{se.Namespace, se.Name}]
		if se.DeletionTimestamp != nil || svc == nil || !mcs.Exportable(svc) {
			continue
		}
		for _, es := range slicesOf[nsName{se.Namespace, se.Name}] {
			if mcs.ExportsSlice(es) {
				in.Exported = append(in.Exported, serviceOf(es))
			}
		}
	}
	return in, problems
}

type nsName struct{ namespace, name string }

// offloadedPods maps the pods running here for consumers to the consumer
// they belong to, by the tenant label of their namespace (set by us, with
// our managed-by label). Only pods with an IP of their own count: a
// hostNetwork pod's IP is its node's, which must never be opened to a
// peer; a pod that has ended no longer holds its IP.
func offloadedPods(namespaces []corev1.Namespace, pods []corev1.Pod) (map[string][]netip.Addr, []inputProblem) {
	tenantOf := tenantNamespaces(namespaces)
	out := map[string][]netip.Addr{}
	var problems []inputProblem
	for i := range pods {
		p := &pods[i]
		c, ok := tenantOf[p.Namespace]
		if !ok || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			a, err := checkedAddr(ip.IP)
			if err != nil {
				problems = append(problems, inputProblem{Object: "Pod " + p.Namespace + "/" + p.Name, Err: err})
				continue
			}
			out[c] = append(out[c], a)
		}
	}
	return out, problems
}

// tenantOfNamespace is the consumer ns was made for, "" when it is not a
// tenant namespace of ours.
func tenantOfNamespace(ns *corev1.Namespace) string {
	if ns.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		return ""
	}
	return ns.Labels[offload.LabelTenant]
}

// tenantNamespaces maps the namespaces we made for consumers to the
// consumer each is for (its tenant label, with our managed-by label).
func tenantNamespaces(namespaces []corev1.Namespace) map[string]string {
	tenantOf := map[string]string{}
	for i := range namespaces {
		if c := tenantOfNamespace(&namespaces[i]); c != "" {
			tenantOf[namespaces[i].Name] = c
		}
	}
	return tenantOf
}

// sliceService is an EndpointSlice as policy sees a Service: its
// addresses, each serving each of its ports (the slice's ports are the
// Service's target ports, resolved for these endpoints). What cannot be
// enforced (an IPv6 address, a port of zero or none, an unknown protocol)
// is left out and named; the rest is kept.
func sliceService(es *discoveryv1.EndpointSlice) (policy.Service, []error) {
	s := policy.Service{Name: es.Namespace + "/" + es.Labels[discoveryv1.LabelServiceName]}
	var errs []error
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
	case discoveryv1.AddressTypeFQDN:
		return s, nil // names, no address to allow
	default:
		return s, []error{fmt.Errorf("address type %s: the tunnel carries IPv4 only; not allowed", es.AddressType)}
	}
	for _, p := range es.Ports {
		port, err := slicePort(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.Ports = append(s.Ports, port)
	}
	for _, e := range es.Endpoints {
		for _, a := range e.Addresses {
			addr, err := checkedAddr(a)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			s.Addresses = append(s.Addresses, addr)
		}
	}
	return s, errs
}

// slicePort is one port of a slice as policy takes it.
func slicePort(p discoveryv1.EndpointPort) (policy.Port, error) {
	name := "port"
	if p.Name != nil && *p.Name != "" {
		name = "port " + *p.Name
	}
	proto := policy.TCP // the API's default
	if p.Protocol != nil {
		switch strings.ToUpper(string(*p.Protocol)) {
		case "TCP":
		case "UDP":
			proto = policy.UDP
		case "SCTP":
			proto = policy.SCTP
		default:
			return policy.Port{}, fmt.Errorf("%s: protocol %q: want TCP, UDP or SCTP; not allowed", name, *p.Protocol)
		}
	}
	switch {
	case p.Port == nil:
		// "All ports" in the API; an allow-list by port cannot say it.
		return policy.Port{}, fmt.Errorf("%s: no port number (all ports): only numbered ports are allowed", name)
	case *p.Port < 1 || *p.Port > 65535:
		return policy.Port{}, fmt.Errorf("%s: port %d: want 1 to 65535; not allowed", name, *p.Port)
	}
	return policy.Port{Protocol: proto, Port: uint16(*p.Port)}, nil
}

// checkedAddr parses an address and refuses what the filter cannot hold.
func checkedAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Addr{}, fmt.Errorf("address %q: %w; not allowed", s, err)
	case !a.Is4():
		return netip.Addr{}, fmt.Errorf("address %s: the tunnel carries IPv4 only; not allowed", a)
	case a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return netip.Addr{}, fmt.Errorf("address %s: not a unicast address; not allowed", a)
	}
	return a, nil
}
