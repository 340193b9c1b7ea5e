package mcs

import (
	"net/netip"
	"slices"
	"testing"
	"time"

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

// The ports an export loses to an older one's are its endpoints' no
// more, by name; the ports it shares exactly stay.
func TestPortsLeftOut(t *testing.T) {
	http80 := Port{Name: "http", Protocol: "TCP", Port: 80}
	http81 := Port{Name: "http", Protocol: "TCP", Port: 81}
	metrics := Port{Name: "metrics", Protocol: "TCP", Port: 9090}
	held := Resolve([]Source{
		{Cluster: "b", Export: Export{Ports: []Port{http80}}},
		{Cluster: "c", Export: Export{Ports: []Port{http81, metrics}, Created: time.Unix(1, 0)}},
	}).Ports
	if got := portsLeftOut([]Port{http80}, held); len(got) != 0 {
		t.Errorf("the oldest export loses %v, want nothing", got)
	}
	if got := portsLeftOut([]Port{http81, metrics}, held); len(got) != 1 || !got["http"] {
		t.Errorf("the younger export loses %v, want http alone", got)
	}
}
