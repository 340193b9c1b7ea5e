package reflection

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/offload"
)

// What a provider reads from, and makes of, the slices a consumer writes
// for endpoints on a third cluster (docs/services.md, "Endpoints on third
// clusters"): pure functions, so that the controller only decides.

// Reasons of flotilla_hosted_endpoints_dropped_total.
const (
	// hostedDropInvalid: the slice is not one a consumer's reflection
	// writes (labels, address type); none of its endpoints is used.
	hostedDropInvalid = "invalid"
	// hostedDropUnknownCluster: the slice names this cluster, or one that
	// is not its peer: nothing here may route there on a consumer's say.
	hostedDropUnknownCluster = "unknown_cluster"
	// hostedDropUntranslatable: an address outside every view this
	// cluster has of the named cluster.
	hostedDropUntranslatable = "untranslatable"
)

// thirdSource is what a consumer-written slice says: whose addresses it
// lists and for which Service.
type thirdSource struct {
	cluster, service string
	family           discoveryv1.AddressType
}

// decodeThirdSlice reads a slice a consumer reflected for endpoints on a
// third cluster; an error says why it is not one. The consumer wrote
// every field: nothing is trusted before it is checked.
func decodeThirdSlice(s *discoveryv1.EndpointSlice) (thirdSource, error) {
	l := s.Labels
	switch {
	case l[offload.LabelReflected] != "true" || l[discoveryv1.LabelManagedBy] != offload.ReflectionManagedBy:
		return thirdSource{}, fmt.Errorf("not reflected by a consumer (want labels %s=true and %s=%s)", offload.LabelReflected, discoveryv1.LabelManagedBy, offload.ReflectionManagedBy)
	case l[discoveryv1.LabelServiceName] != "":
		// kube-proxy would route to it untranslated: never a source.
		return thirdSource{}, fmt.Errorf("carries %s: a slice of third-cluster endpoints must name its Service by %s only", discoveryv1.LabelServiceName, offload.LabelServiceName)
	}
	src := thirdSource{cluster: l[offload.LabelEndpointsOf], service: l[offload.LabelServiceName], family: s.AddressType}
	if err := identity.ValidateClusterID(src.cluster); err != nil {
		return thirdSource{}, fmt.Errorf("label %s: %w", offload.LabelEndpointsOf, err)
	}
	if errs := validation.IsDNS1035Label(src.service); len(errs) > 0 {
		return thirdSource{}, fmt.Errorf("label %s %q is no Service name: %s", offload.LabelServiceName, src.service, strings.Join(errs, "; "))
	}
	if src.family != discoveryv1.AddressTypeIPv4 && src.family != discoveryv1.AddressTypeIPv6 {
		return thirdSource{}, fmt.Errorf("address type %q: want IPv4 or IPv6", src.family)
	}
	return src, nil
}

// translateThird is the slice this cluster routes by for src: each
// endpoint's addresses, the named cluster's own, as this cluster reaches
// them (translate, its view of that cluster); an endpoint with an address
// it cannot translate is left out and counted. Conditions, hostnames and
// ports are kept; the slice is owned by src, so it goes with it.
func translateThird(src *discoveryv1.EndpointSlice, from thirdSource, translate func(cluster string, a netip.Addr) (netip.Addr, bool)) (*discoveryv1.EndpointSlice, int) {
	controller := true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: hostedSliceName(src.Name), Namespace: src.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: from.service,
				discoveryv1.LabelManagedBy:   offload.HostedEndpointsManagedBy,
				offload.LabelEndpointsOf:     from.cluster,
				v1alpha1.LabelManagedBy:      v1alpha1.ManagedByValue,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: discoveryv1.SchemeGroupVersion.String(), Kind: "EndpointSlice",
				Name: src.Name, UID: src.UID, Controller: &controller,
			}},
		},
		AddressType: from.family,
		Ports:       make([]discoveryv1.EndpointPort, 0, len(src.Ports)),
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range src.Ports {
		s.Ports = append(s.Ports, *p.DeepCopy())
	}
	dropped := 0
	for _, e := range src.Endpoints {
		addrs := make([]string, 0, len(e.Addresses))
		for _, a := range e.Addresses {
			ip, err := netip.ParseAddr(a)
			if err == nil {
				ip, ok := translate(from.cluster, ip)
				if ok && ip.Is4() == (from.family == discoveryv1.AddressTypeIPv4) {
					addrs = append(addrs, ip.String())
					continue
				}
			}
			addrs = nil
			break
		}
		if len(addrs) == 0 {
			dropped++
			continue
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: addrs, Conditions: *e.Conditions.DeepCopy(), Hostname: e.Hostname,
		})
	}
	return s, dropped
}

// hostedSliceName names the slice translated from the slice src.
func hostedSliceName(src string) string { return derivedName(src, "translated") }

// derivedName is base-suffix, within the 253 characters of an object
// name: a base too long is cut and a hash of it keeps names apart.
func derivedName(base, suffix string) string {
	const max = validation.DNS1123SubdomainMaxLength
	if len(base)+1+len(suffix) <= max {
		return base + "-" + suffix
	}
	sum := sha256.Sum256([]byte(base))
	h := hex.EncodeToString(sum[:])[:10]
	cut := strings.TrimRight(base[:max-len(suffix)-len(h)-2], "-.")
	return cut + "-" + h + "-" + suffix
}
