package mcsdns

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/offload/mcs"
)

// service is what the zone answers for one ServiceImport: built from it
// and its EndpointSlices, never changed afterwards (a change builds a new
// one), every list sorted so that answers are the same for the same
// objects.
type service struct {
	headless bool
	// addrs answer <svc>.<ns>.svc: the ClusterSetIPs, or a headless
	// Service's ready endpoints of every source cluster.
	addrs []netip.Addr
	// srv answers _<port>._<proto>.<svc>.<ns>.svc, by "_port._proto".
	srv map[string][]srvTarget
	// bare answers SRV at <svc>.<ns>.svc itself: every port, named or
	// not (and, headless, on every host).
	bare []srvTarget
	// hosts answer <hostname>.<clusterid>.<svc>.<ns>.svc (headless
	// only), by "hostname.clusterid"; clusters holds every cluster ID
	// with a host, protos every "_proto" with an SRV name (empty
	// non-terminals).
	hosts    map[string][]netip.Addr
	clusters map[string]bool
	protos   map[string]bool
	// ptrs answer the reverse names of the ClusterSetIPs and of the
	// named hosts' addresses.
	ptrs []ptrName
}

// srvTarget is one SRV record's data: the port and, relative to the
// Service's name, the target ("" for the Service itself,
// "hostname.clusterid" for a headless endpoint).
type srvTarget struct {
	port   uint16
	target string
}

// buildService makes the records of imp from its EndpointSlices (those
// labelled with its name in its namespace). What another cluster wrote
// and cannot be a record (an address that does not parse, a hostname or
// cluster ID that is not a DNS label) is left out; the rest still
// answers. nil: nothing to answer, the name does not exist.
func buildService(imp *mcsv1alpha1.ServiceImport, eps []*discoveryv1.EndpointSlice) *service {
	s := &service{
		headless: imp.Spec.Type == mcsv1alpha1.Headless,
		srv:      map[string][]srvTarget{}, hosts: map[string][]netip.Addr{},
		clusters: map[string]bool{}, protos: map[string]bool{},
	}
	if s.headless {
		s.buildHeadless(eps)
	} else {
		s.buildClusterSetIP(imp)
	}
	if len(s.addrs) == 0 {
		// A ClusterSetIP not allocated yet, or a headless Service without
		// a ready endpoint: per the specification, NXDOMAIN.
		return nil
	}
	byTarget := func(a, b srvTarget) int { return cmp.Or(cmp.Compare(a.target, b.target), cmp.Compare(a.port, b.port)) }
	for k := range s.srv {
		s.protos[k[strings.LastIndexByte(k, '.')+1:]] = true
		slices.SortFunc(s.srv[k], byTarget)
		s.srv[k] = slices.Compact(s.srv[k])
	}
	slices.SortFunc(s.bare, byTarget)
	s.bare = slices.Compact(s.bare)
	return s
}

func (s *service) buildClusterSetIP(imp *mcsv1alpha1.ServiceImport) {
	for _, ip := range imp.Spec.IPs {
		if a, err := netip.ParseAddr(ip); err == nil && a.Zone() == "" {
			s.addrs = append(s.addrs, a.Unmap())
		}
	}
	s.addrs = sortAddrs(s.addrs)
	for _, a := range s.addrs {
		s.ptrs = append(s.ptrs, ptrName{addr: a})
	}
	for _, p := range imp.Spec.Ports {
		if k, ok := srvKey(p.Name, p.Protocol, p.Port); ok {
			s.srv[k] = append(s.srv[k], srvTarget{port: uint16(p.Port)})
		}
		if p.Port > 0 && p.Port <= 65535 {
			s.bare = append(s.bare, srvTarget{port: uint16(p.Port)})
		}
	}
}

func (s *service) buildHeadless(eps []*discoveryv1.EndpointSlice) {
	for _, es := range eps {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices name no address to answer with
		}
		cluster := es.Labels[mcs.LabelSourceCluster]
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue // nil is ready, as for kube-proxy
			}
			var addrs []netip.Addr
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Zone() == "" {
					addrs = append(addrs, ip.Unmap())
				}
			}
			s.addrs = append(s.addrs, addrs...)
			if !isLabel(cluster) {
				continue // answers for the Service, but has no name of its own
			}
			if ep.Hostname != nil {
				if isLabel(*ep.Hostname) {
					s.addHost(*ep.Hostname+"."+cluster, cluster, addrs, es.Ports)
				}
				continue
			}
			// Without a hostname (a slice the importer did not write),
			// the specification's "system-assigned identifier": the
			// address, dashed, as CoreDNS names them.
			for _, a := range addrs {
				if h := mcs.AddressLabel(a); isLabel(h) {
					s.addHost(h+"."+cluster, cluster, []netip.Addr{a}, es.Ports)
				}
			}
		}
	}
	s.addrs = sortAddrs(s.addrs)
	for h := range s.hosts {
		s.hosts[h] = sortAddrs(s.hosts[h])
	}
}

// addHost gives host (hostname.clusterid) addrs and an SRV target for
// each named port of its slice.
func (s *service) addHost(host, cluster string, addrs []netip.Addr, ports []discoveryv1.EndpointPort) {
	if len(addrs) == 0 {
		return
	}
	s.hosts[host] = append(s.hosts[host], addrs...)
	for _, a := range addrs {
		s.ptrs = append(s.ptrs, ptrName{addr: a, host: host})
	}
	s.clusters[cluster] = true
	for _, p := range ports {
		if p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
			s.bare = append(s.bare, srvTarget{port: uint16(*p.Port), target: host})
		}
		if p.Name == nil || p.Port == nil {
			continue
		}
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if k, ok := srvKey(*p.Name, proto, *p.Port); ok {
			s.srv[k] = append(s.srv[k], srvTarget{port: uint16(*p.Port), target: host})
		}
	}
}

// srvKey is the two labels of a port's SRV name; unnamed ports have none.
func srvKey(name string, proto corev1.Protocol, port int32) (string, bool) {
	p := strings.ToLower(string(proto))
	if p == "" {
		p = "tcp"
	}
	if name == "" || !isLabel(name) || !isLabel(p) || port < 1 || port > 65535 {
		return "", false
	}
	return "_" + name + "._" + p, true
}

func sortAddrs(a []netip.Addr) []netip.Addr {
	slices.SortFunc(a, netip.Addr.Compare)
	return slices.Compact(a)
}
