package mcsdns

import (
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Reverse lookups of ClusterSetIPs and of headless endpoints' addresses
// answer with their clusterset names (KEP-1645's DNS specification, the
// PTR records of 2.2 and 2.4); addresses the zone does not hold are
// refused, as any name outside it.
func TestReverseAnswers(t *testing.T) {
	s := testZone()
	rev := func(a string) string {
		n, err := dns.ReverseAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		qname string
		qtype uint16
		rcode int
		want  []string
	}{
		{rev("10.100.0.7"), dns.TypePTR, dns.RcodeSuccess, []string{"PTR web.shop.svc.clusterset.local."}},
		{rev("fd00::7"), dns.TypePTR, dns.RcodeSuccess, []string{"PTR web.shop.svc.clusterset.local."}},
		{strings.ToUpper(rev("10.100.0.7")), dns.TypePTR, dns.RcodeSuccess, []string{"PTR web.shop.svc.clusterset.local."}},
		{rev("10.1.0.10"), dns.TypePTR, dns.RcodeSuccess, []string{"PTR db-0." + clusterA + ".db.shop.svc.clusterset.local."}},
		{rev("10.2.0.10"), dns.TypePTR, dns.RcodeSuccess, []string{"PTR db-0." + clusterB + ".db.shop.svc.clusterset.local."}},
		// Named after its address: the name its A record answers at.
		{rev("10.1.0.13"), dns.TypePTR, dns.RcodeSuccess, []string{"PTR 10-1-0-13." + clusterA + ".db.shop.svc.clusterset.local."}},
		{rev("10.1.0.10"), dns.TypeANY, dns.RcodeSuccess, []string{`HINFO "RFC8482" ""`}},
		{rev("10.1.0.10"), dns.TypeA, dns.RcodeSuccess, nil},
		// Not ready: no name, as no A record.
		{rev("10.1.0.12"), dns.TypePTR, dns.RcodeRefused, nil},
		// A cluster ID that is no label gives the endpoint no name.
		{rev("10.3.0.10"), dns.TypePTR, dns.RcodeRefused, nil},
		{rev("192.0.2.1"), dns.TypePTR, dns.RcodeRefused, nil},
		{"0.100.10.in-addr.arpa.", dns.TypePTR, dns.RcodeRefused, nil},
		{"in-addr.arpa.", dns.TypePTR, dns.RcodeRefused, nil},
	} {
		resp := query(s, tc.qname, tc.qtype)
		if got := rdata(resp.Answer); resp.Rcode != tc.rcode || !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %s %q, want %s %q", tc.qname, dns.TypeToString[tc.qtype],
				dns.RcodeToString[resp.Rcode], got, dns.RcodeToString[tc.rcode], tc.want)
		}
		answered := tc.rcode == dns.RcodeSuccess
		if resp.Authoritative != answered || resp.RecursionAvailable != answered {
			t.Errorf("%s: AA %v, RA %v, want both %v", tc.qname, resp.Authoritative, resp.RecursionAvailable, answered)
		}
		for _, rr := range resp.Answer {
			if rr.Header().Ttl != TTL || rr.Header().Name != tc.qname {
				t.Errorf("%s: record %s: want owner as asked and TTL %d", tc.qname, rr, TTL)
			}
		}
	}
}

// An address two Services share answers with both names, sorted; a
// Service changed or removed takes its names along and leaves the other's.
func TestReverseFollowsChanges(t *testing.T) {
	s := testZone()
	ptrs := func(a string) []string {
		n, _ := dns.ReverseAddr(a)
		return rdata(query(s, n, dns.TypePTR).Answer)
	}
	s.zone.set("shop/db2", buildService(headlessImport("shop", "db2"), []*discoveryv1.EndpointSlice{
		importedSlice("shop", "db2", "db2-a", clusterA, discoveryv1.AddressTypeIPv4, endpoint{hostname: "x", addrs: []string{"10.1.0.10"}}),
	}))
	both := []string{"PTR db-0." + clusterA + ".db.shop.svc.clusterset.local.", "PTR x." + clusterA + ".db2.shop.svc.clusterset.local."}
	if got := ptrs("10.1.0.10"); !slices.Equal(got, both) {
		t.Errorf("an address of two Services: %q, want %q", got, both)
	}
	s.zone.set("shop/web", buildService(clusterSetImport("shop", "web", "10.100.0.8"), nil))
	if got := ptrs("10.100.0.7"); got != nil {
		t.Errorf("the old ClusterSetIP after a change: %q, want nothing", got)
	}
	if got := ptrs("10.100.0.8"); !slices.Equal(got, []string{"PTR web.shop.svc.clusterset.local."}) {
		t.Errorf("the new ClusterSetIP: %q", got)
	}
	s.zone.set("shop/db", nil)
	if got := ptrs("10.1.0.10"); !slices.Equal(got, both[1:]) {
		t.Errorf("the address once db is gone: %q, want %q", got, both[1:])
	}
	s.zone.set("shop/db2", nil)
	s.zone.set("shop/web", nil)
	if len(s.zone.ptrs) != 0 {
		t.Errorf("reverse names left after every Service went: %v", s.zone.ptrs)
	}
}

func TestReverseAddr(t *testing.T) {
	for qname, want := range map[string]string{
		"7.0.100.10.in-addr.arpa.": "10.100.0.7",
		"0.0.0.0.in-addr.arpa.":    "0.0.0.0",
		"7.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.": "fd00::7",
		"07.0.100.10.in-addr.arpa.":  "",
		"256.0.100.10.in-addr.arpa.": "",
		"-1.0.100.10.in-addr.arpa.":  "",
		"0.100.10.in-addr.arpa.":     "",
		"1.0.0.100.10.in-addr.arpa.": "",
		"7.0.100.10.in-addr.arpa":    "",
		"x.0.100.10.in-addr.arpa.":   "",
		"g.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.":  "",
		"07.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.": "",
		"0.0.d.f.ip6.arpa.":              "",
		"web.shop.svc.clusterset.local.": "",
	} {
		a, ok := reverseAddr(qname)
		if got := map[bool]string{true: a.String(), false: ""}[ok]; got != want {
			t.Errorf("reverseAddr(%q) = %q, want %q", qname, got, want)
		}
	}
}

// FuzzReverseAddr: any name a client sends is read without a panic, and
// an address read back is the one whose reverse name was asked.
func FuzzReverseAddr(f *testing.F) {
	for _, s := range []string{
		"7.0.100.10.in-addr.arpa.", "0.100.10.in-addr.arpa.", "in-addr.arpa.", "..in-addr.arpa.",
		"7.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", "+1.0.0.0.in-addr.arpa.",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, qname string) {
		a, ok := reverseAddr(strings.ToLower(qname))
		if !ok {
			return
		}
		if want, err := dns.ReverseAddr(a.String()); err != nil || want != strings.ToLower(qname) {
			t.Fatalf("reverseAddr(%q) = %s, whose reverse name is %q (%v)", qname, a, want, err)
		}
	})
}
