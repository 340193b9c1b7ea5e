package mcs

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A headless import's families are its endpoints', IPv4 first, and IPv4
// before any endpoint is known.
func TestEndpointFamilies(t *testing.T) {
	source := func(addrs ...string) Source {
		var e Endpoint
		for _, a := range addrs {
			e.Addresses = append(e.Addresses, netip.MustParseAddr(a))
		}
		return Source{Export: Export{Slices: []Slice{{Endpoints: []Endpoint{e}}}}}
	}
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	for _, c := range []struct {
		name    string
		sources []Source
		want    []corev1.IPFamily
	}{
		{"no endpoint yet", nil, []corev1.IPFamily{v4}},
		{"IPv4", []Source{source("10.1.0.1")}, []corev1.IPFamily{v4}},
		{"IPv4 mapped in IPv6", []Source{source("::ffff:10.1.0.1")}, []corev1.IPFamily{v4}},
		{"IPv6 only", []Source{source("fd00::1")}, []corev1.IPFamily{v6}},
		{"both, over two clusters", []Source{source("fd00::1"), source("10.1.0.1")}, []corev1.IPFamily{v4, v6}},
	} {
		if got := endpointFamilies(c.sources); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
