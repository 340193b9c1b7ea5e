package policy

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, addr(s))
	}
	return out
}

func ep(a string, p Protocol, port uint16) Endpoint {
	return Endpoint{Addr: addr(a), Protocol: p, Port: port}
}

// A Segregated peer is allowed its offloaded pods and every address of the
// Services given to it on every port of those Services; a Full peer gets
// no sets at all, so nothing of its traffic is filtered.
func TestDecide(t *testing.T) {
	web := Service{Name: "shop/web", Addresses: addrs("10.0.0.8", "10.90.1.4"),
		Ports: []Port{{TCP, 8080}, {UDP, 53}}}
	tests := []struct {
		name  string
		peers []Peer
		want  []Sets
	}{
		{"full peer has no sets", []Peer{{ID: "b", Mode: Full, Pods: addrs("10.0.0.5")}}, nil},
		{"empty mode is full", []Peer{{ID: "b", Pods: addrs("10.0.0.5")}}, nil},
		{"segregated peer with nothing gets empty sets", []Peer{{ID: "b", Mode: Segregated}},
			[]Sets{{Peer: "b"}}},
		{"offloaded pods, sorted and deduplicated", []Peer{{ID: "b", Mode: Segregated,
			Pods: addrs("10.0.0.9", "10.0.0.5", "10.0.0.9")}},
			[]Sets{{Peer: "b", Pods: addrs("10.0.0.5", "10.0.0.9")}}},
		{"service: every address on every port", []Peer{{ID: "b", Mode: Segregated, Services: []Service{web}}},
			[]Sets{{Peer: "b", Services: []Endpoint{
				ep("10.0.0.8", TCP, 8080), ep("10.0.0.8", UDP, 53),
				ep("10.90.1.4", TCP, 8080), ep("10.90.1.4", UDP, 53)}}}},
		{"the same endpoint in two services once", []Peer{{ID: "b", Mode: Segregated, Services: []Service{
			{Name: "a/x", Addresses: addrs("10.0.0.8"), Ports: []Port{{TCP, 80}}},
			{Name: "a/y", Addresses: addrs("10.0.0.8"), Ports: []Port{{TCP, 80}, {TCP, 443}}}}}},
			[]Sets{{Peer: "b", Services: []Endpoint{ep("10.0.0.8", TCP, 80), ep("10.0.0.8", TCP, 443)}}}},
		{"service without endpoints allows nothing", []Peer{{ID: "b", Mode: Segregated, Services: []Service{
			{Name: "a/x", Ports: []Port{{TCP, 80}}}}}}, []Sets{{Peer: "b"}}},
		{"peers sorted, full ones left out", []Peer{
			{ID: "c", Mode: Segregated, Pods: addrs("10.0.0.7")},
			{ID: "a", Mode: Full, Pods: addrs("10.0.0.6")},
			{ID: "b", Mode: Segregated, Pods: addrs("10.0.0.5")}},
			[]Sets{{Peer: "b", Pods: addrs("10.0.0.5")}, {Peer: "c", Pods: addrs("10.0.0.7")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decide(tc.peers)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decide = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Input that cannot be enforced exactly is refused with an error naming
// the peer and the culprit, never turned into a smaller or larger set.
func TestDecideRefuses(t *testing.T) {
	seg := func(p Peer) Peer { p.Mode = Segregated; return p }
	tests := []struct {
		name  string
		peers []Peer
		want  string
	}{
		{"no id", []Peer{{Mode: Segregated}}, "no cluster ID"},
		{"bad id", []Peer{{ID: "b/../c"}}, "may hold only"},
		{"peer twice", []Peer{{ID: "b"}, {ID: "b"}}, "listed twice"},
		{"unknown mode", []Peer{{ID: "b", Mode: "Partial"}}, `traffic mode "Partial"`},
		{"ipv6 pod", []Peer{seg(Peer{ID: "b", Pods: addrs("fd00::1")})}, "offloaded pod fd00::1: only IPv4"},
		{"zero pod", []Peer{seg(Peer{ID: "b", Pods: []netip.Addr{{}}})}, "no address"},
		{"multicast endpoint", []Peer{seg(Peer{ID: "b", Services: []Service{
			{Name: "a/x", Addresses: addrs("224.0.0.1"), Ports: []Port{{UDP, 5353}}}}})}, "service a/x: endpoint 224.0.0.1"},
		{"port zero", []Peer{seg(Peer{ID: "b", Services: []Service{
			{Name: "a/x", Addresses: addrs("10.0.0.1"), Ports: []Port{{TCP, 0}}}}})}, "service a/x: tcp port 0"},
		{"icmp port", []Peer{seg(Peer{ID: "b", Services: []Service{
			{Name: "a/x", Addresses: addrs("10.0.0.1"), Ports: []Port{{1, 7}}}}})}, "protocol 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decide(tc.peers)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decide = %+v, %v; want an error containing %q", got, err, tc.want)
			}
		})
	}
}

func TestDiff(t *testing.T) {
	b1 := Sets{Peer: "b", Pods: addrs("10.0.0.5", "10.0.0.6"), Services: []Endpoint{ep("10.0.0.8", TCP, 80)}}
	b2 := Sets{Peer: "b", Pods: addrs("10.0.0.6", "10.0.0.7"), Services: []Endpoint{ep("10.0.0.8", TCP, 80), ep("10.0.0.8", TCP, 443)}}
	c := Sets{Peer: "c", Pods: addrs("10.0.0.9")}
	tests := []struct {
		name     string
		old, new []Sets
		want     []Delta
	}{
		{"nothing to nothing", nil, nil, nil},
		{"unchanged", []Sets{b1, c}, []Sets{b1, c}, nil},
		{"peer becomes segregated", nil, []Sets{c},
			[]Delta{{Peer: "c", Created: true, AddPods: addrs("10.0.0.9")}}},
		{"peer becomes full", []Sets{b1, c}, []Sets{b1},
			[]Delta{{Peer: "c", Deleted: true, DelPods: addrs("10.0.0.9")}}},
		{"elements change, other peer untouched", []Sets{b1, c}, []Sets{b2, c},
			[]Delta{{Peer: "b", AddPods: addrs("10.0.0.7"), DelPods: addrs("10.0.0.5"),
				AddServices: []Endpoint{ep("10.0.0.8", TCP, 443)}}}},
		{"empty sets created", nil, []Sets{{Peer: "d"}}, []Delta{{Peer: "d", Created: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Diff(tc.old, tc.new); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Diff = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Applying Diff(old, new) to old gives new, for random decisions: the
// delta is exactly the change, whatever the sets hold.
func TestDiffApplied(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	random := func() []Sets {
		var peers []Peer
		for _, id := range []string{"a", "b", "c", "d"} {
			if r.IntN(3) == 0 {
				continue
			}
			p := Peer{ID: id, Mode: Segregated}
			for range r.IntN(20) {
				p.Pods = append(p.Pods, netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(32) + 1)}))
			}
			svc := Service{Name: "s", Ports: []Port{{TCP, uint16(r.IntN(3) + 80)}}}
			for range r.IntN(10) {
				svc.Addresses = append(svc.Addresses, netip.AddrFrom4([4]byte{10, 1, 0, byte(r.IntN(16) + 1)}))
			}
			p.Services = []Service{svc}
			peers = append(peers, p)
		}
		s, err := Decide(peers)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for range 500 {
		old, new := random(), random()
		got := apply(old, Diff(old, new))
		if !reflect.DeepEqual(normal(got), normal(new)) {
			t.Fatalf("old %+v\n+ Diff = %+v\nwant %+v", old, got, new)
		}
	}
}

// apply is the reference a kernel set follows: elements added and removed.
func apply(old []Sets, ds []Delta) []Sets {
	byPeer := map[string]Sets{}
	for _, s := range old {
		byPeer[s.Peer] = s
	}
	for _, d := range ds {
		if d.Deleted {
			delete(byPeer, d.Peer)
			continue
		}
		s := byPeer[d.Peer]
		s.Peer = d.Peer
		s.Pods = slices.DeleteFunc(slices.Clone(s.Pods), func(a netip.Addr) bool { return slices.Contains(d.DelPods, a) })
		s.Pods = append(s.Pods, d.AddPods...)
		slices.SortFunc(s.Pods, netip.Addr.Compare)
		s.Services = slices.DeleteFunc(slices.Clone(s.Services), func(e Endpoint) bool { return slices.Contains(d.DelServices, e) })
		s.Services = append(s.Services, d.AddServices...)
		slices.SortFunc(s.Services, CompareEndpoint)
		byPeer[d.Peer] = s
	}
	var out []Sets
	for _, s := range byPeer {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Sets) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

// normal makes empty and nil lists compare equal.
func normal(ss []Sets) []Sets {
	out := []Sets{}
	for _, s := range ss {
		if len(s.Pods) == 0 {
			s.Pods = nil
		}
		if len(s.Services) == 0 {
			s.Services = nil
		}
		out = append(out, s)
	}
	return out
}
