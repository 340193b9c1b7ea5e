package mcsdns

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/offload/mcs"
)

const (
	clusterA = "caaaaaaaaaaaaaaaaaaaaaaaaaa"
	clusterB = "cbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// ours labels an object as the importer (offload/mcs) writes it.
func ours() map[string]string { return map[string]string{mcs.LabelManagedBy: mcs.ManagedBy} }

func clusterSetImport(ns, name string, ips ...string) *mcsv1alpha1.ServiceImport {
	return &mcsv1alpha1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: ours()},
		Spec: mcsv1alpha1.ServiceImportSpec{
			Type: mcsv1alpha1.ClusterSetIP, IPs: ips,
			Ports: []mcsv1alpha1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
				{Protocol: corev1.ProtocolTCP, Port: 8080}, // unnamed: no SRV
			},
		},
	}
}

func headlessImport(ns, name string) *mcsv1alpha1.ServiceImport {
	return &mcsv1alpha1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: ours()},
		Spec: mcsv1alpha1.ServiceImportSpec{
			Type: mcsv1alpha1.Headless, Ports: []mcsv1alpha1.ServicePort{{Name: "db", Protocol: corev1.ProtocolTCP, Port: 5432}},
		},
	}
}

// endpoint is one endpoint of a slice: hostname "" for none.
type endpoint struct {
	hostname string
	ready    *bool
	addrs    []string
}

func importedSlice(ns, svc, name, cluster string, family discoveryv1.AddressType, eps ...endpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			mcs.LabelServiceName: svc, mcs.LabelSourceCluster: cluster, discoveryv1.LabelManagedBy: mcs.ManagedBy,
		}},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("db"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](5432)}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: e.addrs, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}}
		if e.hostname != "" {
			ep.Hostname = ptr.To(e.hostname)
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

// testZone is a zone of a ClusterSetIP Service web.shop and a headless
// db.shop with endpoints in two clusters.
func testZone() *Server {
	s := &Server{zone: newTable(1), synced: make(chan struct{})}
	close(s.synced)
	s.zone.set("shop/web", buildService(clusterSetImport("shop", "web", "10.100.0.7", "fd00::7"), nil))
	s.zone.set("shop/db", buildService(headlessImport("shop", "db"), []*discoveryv1.EndpointSlice{
		importedSlice("shop", "db", "db-a", clusterA, discoveryv1.AddressTypeIPv4,
			endpoint{hostname: "db-0", addrs: []string{"10.1.0.10"}},
			endpoint{hostname: "db-1", ready: ptr.To(true), addrs: []string{"10.1.0.11"}},
			endpoint{hostname: "db-2", ready: ptr.To(false), addrs: []string{"10.1.0.12"}},
			endpoint{addrs: []string{"10.1.0.13"}}),
		importedSlice("shop", "db", "db-b", clusterB, discoveryv1.AddressTypeIPv4,
			endpoint{hostname: "db-0", addrs: []string{"10.2.0.10"}}),
		// A cluster label that is no DNS label: its endpoints answer for
		// the Service, but have no name of their own.
		importedSlice("shop", "db", "db-x", "Not_A_Label", discoveryv1.AddressTypeIPv4,
			endpoint{hostname: "db-0", addrs: []string{"10.3.0.10", "not-an-ip"}}),
	}))
	s.zone.set("shop/empty", buildService(headlessImport("shop", "empty"), nil))
	s.zone.set("shop/pending", buildService(clusterSetImport("shop", "pending"), nil))
	return s
}

func query(s *Server, qname string, qtype uint16) *dns.Msg {
	req := new(dns.Msg)
	req.SetQuestion(qname, qtype)
	return s.respond(req)
}

// rdata is the answer's records without owner and TTL, in order.
func rdata(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		hdr := rr.Header().String()
		out = append(out, dns.TypeToString[rr.Header().Rrtype]+" "+strings.TrimSpace(strings.TrimPrefix(rr.String(), hdr)))
	}
	return out
}

func TestAnswers(t *testing.T) {
	s := testZone()
	for _, tc := range []struct {
		qname string
		qtype uint16
		rcode int
		want  []string
	}{
		{"web.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.100.0.7"}},
		{"WEB.Shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.100.0.7"}},
		{"web.shop.svc.clusterset.local.", dns.TypeAAAA, dns.RcodeSuccess, []string{"AAAA fd00::7"}},
		{"web.shop.svc.clusterset.local.", dns.TypeTXT, dns.RcodeSuccess, nil},
		{"_http._tcp.web.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, []string{"SRV 0 100 80 web.shop.svc.clusterset.local."}},
		{"_dns._udp.web.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, []string{"SRV 0 100 53 web.shop.svc.clusterset.local."}},
		{"_http._udp.web.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeNameError, nil},
		{"_tcp.web.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, nil},
		// SRV at the Service's own name: one record per port, named or not.
		{"web.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"SRV 0 100 80 web.shop.svc.clusterset.local.",
			"SRV 0 100 53 web.shop.svc.clusterset.local.",
			"SRV 0 100 8080 web.shop.svc.clusterset.local.",
		}},
		// Headless: one per port on every host.
		{"db.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"SRV 0 100 5432 db-0." + clusterA + ".db.shop.svc.clusterset.local.",
			"SRV 0 100 5432 db-1." + clusterA + ".db.shop.svc.clusterset.local.",
			"SRV 0 100 5432 db-0." + clusterB + ".db.shop.svc.clusterset.local.",
			"SRV 0 100 5432 10-1-0-13." + clusterA + ".db.shop.svc.clusterset.local.",
		}},
		// A ClusterSetIP Service has no per-cluster names (2.3.4).
		{clusterA + ".web.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess,
			[]string{"A 10.1.0.10", "A 10.1.0.11", "A 10.1.0.13", "A 10.2.0.10", "A 10.3.0.10"}},
		{"db-0." + clusterA + ".db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.1.0.10"}},
		{"db-0." + clusterB + ".db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.2.0.10"}},
		{"db-2." + clusterA + ".db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{clusterA + ".db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, nil},
		{"_db._tcp.db.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"SRV 0 100 5432 db-0." + clusterA + ".db.shop.svc.clusterset.local.",
			"SRV 0 100 5432 db-1." + clusterA + ".db.shop.svc.clusterset.local.",
			"SRV 0 100 5432 db-0." + clusterB + ".db.shop.svc.clusterset.local.",
			"SRV 0 100 5432 10-1-0-13." + clusterA + ".db.shop.svc.clusterset.local.",
		}},
		// An endpoint without a hostname is named by its address.
		{"10-1-0-13." + clusterA + ".db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.1.0.13"}},
		// No ready endpoint, no ClusterSetIP yet: NXDOMAIN.
		{"empty.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"pending.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"nope.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"web.other.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, nil},
		{"other.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, nil},
		{"dns-version.clusterset.local.", dns.TypeTXT, dns.RcodeSuccess, []string{`TXT "1.0.0"`}},
		// ANY gets one synthesized record where the name has records
		// (RFC 8482), never all of them.
		{"db.shop.svc.clusterset.local.", dns.TypeANY, dns.RcodeSuccess, []string{`HINFO "RFC8482" ""`}},
		{"_db._tcp.db.shop.svc.clusterset.local.", dns.TypeANY, dns.RcodeSuccess, []string{`HINFO "RFC8482" ""`}},
		{"clusterset.local.", dns.TypeANY, dns.RcodeSuccess, []string{`HINFO "RFC8482" ""`}},
		{"shop.svc.clusterset.local.", dns.TypeANY, dns.RcodeSuccess, nil},
		{"nope.shop.svc.clusterset.local.", dns.TypeANY, dns.RcodeNameError, nil},
		{"web.shop.svc.cluster.local.", dns.TypeA, dns.RcodeRefused, nil},
		{"example.com.", dns.TypeA, dns.RcodeRefused, nil},
	} {
		resp := query(s, tc.qname, tc.qtype)
		got := rdata(resp.Answer)
		// Sorted by target's cluster, then host: compare as the server
		// orders, which is deterministic; the test lists them by hand.
		if tc.qtype == dns.TypeSRV {
			slices.Sort(got)
			slices.Sort(tc.want)
		}
		if resp.Rcode != tc.rcode || !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %s %q, want %s %q", tc.qname, dns.TypeToString[tc.qtype],
				dns.RcodeToString[resp.Rcode], got, dns.RcodeToString[tc.rcode], tc.want)
		}
		for _, rr := range resp.Answer {
			if rr.Header().Ttl != TTL || rr.Header().Name != tc.qname {
				t.Errorf("%s: record %s: want owner as asked and TTL %d", tc.qname, rr, TTL)
			}
		}
		inZone := tc.rcode != dns.RcodeRefused
		if resp.Authoritative != inZone {
			t.Errorf("%s: authoritative %v", tc.qname, resp.Authoritative)
		}
		// The question asks for recursion (SetQuestion sets RD): the
		// zone's answers are final, so they say recursion is available.
		if resp.RecursionAvailable != inZone {
			t.Errorf("%s: recursion available %v, want %v", tc.qname, resp.RecursionAvailable, inZone)
		}
		if inZone && len(resp.Answer) == 0 {
			// A resolver keeps the negative answer for the SOA's TTL
			// and minimum, whichever is less (RFC 2308); CoreDNS's
			// cache reads the TTL.
			if len(resp.Ns) != 1 || resp.Ns[0].Header().Rrtype != dns.TypeSOA ||
				resp.Ns[0].(*dns.SOA).Minttl != NegativeTTL || resp.Ns[0].Header().Ttl != NegativeTTL {
				t.Errorf("%s: authority %v, want the zone's SOA with TTL and minimum %d", tc.qname, resp.Ns, NegativeTTL)
			}
		}
		if !inZone && len(resp.Ns) != 0 {
			t.Errorf("%s: refused, but authority %v", tc.qname, resp.Ns)
		}
	}
}

// A question that does not ask for recursion gets no RA.
func TestNoRecursionAskedNoneOffered(t *testing.T) {
	s := testZone()
	req := new(dns.Msg)
	req.SetQuestion("db.shop.svc.clusterset.local.", dns.TypeA)
	req.RecursionDesired = false
	if resp := s.respond(req); resp.RecursionAvailable || !resp.Authoritative {
		t.Errorf("RA %v, AA %v; want no RA, AA", resp.RecursionAvailable, resp.Authoritative)
	}
}

// The SRV answer carries its targets' addresses, and the same question
// gets the same answer, records in the same order.
func TestSRVAdditionalAndOrder(t *testing.T) {
	s := testZone()
	resp := query(s, "_db._tcp.db.shop.svc.clusterset.local.", dns.TypeSRV)
	// Targets in name order: 10-1-0-13.<A>, db-0.<A>, db-0.<B>, db-1.<A>.
	want := []string{"A 10.1.0.13", "A 10.1.0.10", "A 10.2.0.10", "A 10.1.0.11"}
	if got := rdata(resp.Extra); !slices.Equal(got, want) {
		t.Errorf("additional %q, want %q", got, want)
	}
	for range 20 {
		again := query(s, "_db._tcp.db.shop.svc.clusterset.local.", dns.TypeSRV)
		if !slices.Equal(rdata(again.Answer), rdata(resp.Answer)) {
			t.Fatalf("answers differ: %q then %q", rdata(resp.Answer), rdata(again.Answer))
		}
	}
}

func TestMalformedQueries(t *testing.T) {
	s := testZone()
	none := new(dns.Msg)
	none.Id = 7
	if r := s.respond(none); r.Rcode != dns.RcodeFormatError {
		t.Errorf("no question: %s, want FORMERR", dns.RcodeToString[r.Rcode])
	}
	two := new(dns.Msg)
	two.SetQuestion("web.shop.svc.clusterset.local.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	if r := s.respond(two); r.Rcode != dns.RcodeFormatError {
		t.Errorf("two questions: %s, want FORMERR", dns.RcodeToString[r.Rcode])
	}
	update := new(dns.Msg)
	update.SetUpdate(mcs.Zone)
	if r := s.respond(update); r.Rcode != dns.RcodeNotImplemented {
		t.Errorf("update: %s, want NOTIMP", dns.RcodeToString[r.Rcode])
	}
	chaos := new(dns.Msg)
	chaos.SetQuestion("web.shop.svc.clusterset.local.", dns.TypeA)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	if r := s.respond(chaos); r.Rcode != dns.RcodeRefused {
		t.Errorf("class CH: %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
}

// Before the first pass over the ServiceImports, nothing is cached as
// missing: SERVFAIL.
func TestNotSyncedServfail(t *testing.T) {
	s := &Server{zone: newTable(1), synced: make(chan struct{})}
	if r := query(s, "web.shop.svc.clusterset.local.", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("before sync: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}

// FuzzBuildService: whatever another cluster put into an imported slice
// (hostnames, cluster IDs, addresses), building its records does not
// panic and every name and address it answers with is well formed.
func FuzzBuildService(f *testing.F) {
	f.Add("db-0", clusterA, "10.1.0.1", "db", "TCP", int32(5432), true)
	f.Add("", "x", "fd00::1", "", "", int32(0), false)
	f.Add("A.B", "..", "10.0.0.1%eth0", "x", "sctp", int32(70000), true)
	f.Fuzz(func(t *testing.T, hostname, cluster, addr, port, proto string, portNum int32, headless bool) {
		imp := clusterSetImport("shop", "svc", addr)
		if headless {
			imp = headlessImport("shop", "svc")
		}
		imp.Spec.Ports = append(imp.Spec.Ports, mcsv1alpha1.ServicePort{Name: port, Protocol: corev1.Protocol(proto), Port: portNum})
		es := importedSlice("shop", "svc", "s", cluster, discoveryv1.AddressTypeIPv4, endpoint{hostname: hostname, addrs: []string{addr}})
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &port, Protocol: ptr.To(corev1.Protocol(proto)), Port: &portNum})
		s := buildService(imp, []*discoveryv1.EndpointSlice{es})
		if s == nil {
			return
		}
		for _, a := range s.addrs {
			if !a.IsValid() || a.Zone() != "" {
				t.Fatalf("address %v", a)
			}
		}
		for k, targets := range s.srv {
			if _, ok := dns.IsDomainName(k + ".x."); !ok {
				t.Fatalf("SRV name %q", k)
			}
			for _, tg := range targets {
				if tg.port == 0 {
					t.Fatalf("SRV %s: port 0", k)
				}
			}
		}
		for _, p := range s.ptrs {
			if !slices.Contains(s.addrs, p.addr) || (p.host != "" && s.hosts[p.host] == nil) {
				t.Fatalf("reverse name of %v (host %q): not an address or host the Service answers with", p.addr, p.host)
			}
		}
		for h, addrs := range s.hosts {
			first, second, _ := strings.Cut(h, ".")
			if !isLabel(first) || !isLabel(second) || len(addrs) == 0 {
				t.Fatalf("host %q: %v", h, addrs)
			}
			for _, a := range addrs {
				if !slices.Contains(s.addrs, a) {
					t.Fatalf("host %q: %v not among the Service's %v", h, a, s.addrs)
				}
			}
		}
	})
}

// FuzzRespond: any message a client can send that the library unpacks is
// answered without a panic, with an answer that packs.
func FuzzRespond(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"web.shop.svc.clusterset.local.", dns.TypeA},
		{"_db._tcp.db.shop.svc.clusterset.local.", dns.TypeSRV},
		{"db-0." + clusterA + ".db.shop.svc.clusterset.local.", dns.TypeANY},
		{"example.com.", dns.TypeA},
		{"10.0.1.10.in-addr.arpa.", dns.TypePTR},
		{"7.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR},
	} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(4096, false)
		raw, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	s := testZone()
	f.Fuzz(func(t *testing.T, raw []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(raw); err != nil {
			return
		}
		resp := s.respond(req)
		if _, err := resp.Pack(); err != nil {
			t.Fatalf("answer to %v does not pack: %v", req, err)
		}
	})
}

// recorder is a dns.ResponseWriter that keeps the answer written.
type recorder struct {
	dns.ResponseWriter
	remote net.Addr
	msg    *dns.Msg
}

func (r *recorder) RemoteAddr() net.Addr      { return r.remote }
func (r *recorder) WriteMsg(m *dns.Msg) error { r.msg = m; return nil }

// Over UDP an answer larger than the client's size, or than 1232 bytes
// whatever the client offers, is truncated (TC), so that the client asks
// again over TCP; over TCP, or with room, it is whole.
func TestUDPTruncation(t *testing.T) {
	s := &Server{zone: newTable(1), synced: make(chan struct{}), queries: newQueriesMetric(), truncated: newTruncatedMetric()}
	close(s.synced)
	var eps []endpoint
	for i := range 40 {
		eps = append(eps, endpoint{hostname: fmt.Sprintf("db-%d", i), addrs: []string{fmt.Sprintf("10.1.0.%d", i+1)}})
	}
	s.zone.set("shop/db", buildService(headlessImport("shop", "db"), []*discoveryv1.EndpointSlice{
		importedSlice("shop", "db", "db-a", clusterA, discoveryv1.AddressTypeIPv4, eps...)}))
	udp := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353}
	tcp := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353}
	const srv, host = "_db._tcp.db.shop.svc.clusterset.local.", "db.shop.svc.clusterset.local."
	for _, tc := range []struct {
		what    string
		qname   string
		remote  net.Addr
		edns    uint16
		limit   int // the most bytes sent, when truncated
		records int // in the answer, when whole
	}{
		{"UDP, no EDNS0", srv, udp, 0, dns.MinMsgSize, 0},
		{"UDP, EDNS0 1000", srv, udp, 1000, 1000, 0},
		{"UDP, EDNS0 65000", srv, udp, 65000, maxUDPAnswer, 0},
		{"UDP, EDNS0 65000, a small answer", host, udp, 65000, 0, 40},
		{"TCP", srv, tcp, 0, 0, 40},
	} {
		before := testutil.ToFloat64(s.truncated)
		req := new(dns.Msg)
		req.SetQuestion(tc.qname, dns.TypeSRV)
		if tc.qname == host {
			req.Question[0].Qtype = dns.TypeA
		}
		if tc.edns != 0 {
			req.SetEdns0(tc.edns, false)
		}
		w := &recorder{remote: tc.remote}
		s.ServeDNS(w, req)
		raw, err := w.msg.Pack()
		if err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		truncated := tc.limit != 0
		if w.msg.Truncated != truncated {
			t.Errorf("%s: TC %v, want %v", tc.what, w.msg.Truncated, truncated)
		}
		if counted := testutil.ToFloat64(s.truncated) - before; counted != map[bool]float64{true: 1}[truncated] {
			t.Errorf("%s: %v truncations counted", tc.what, counted)
		}
		if truncated && len(raw) > tc.limit {
			t.Errorf("%s: %d bytes, more than %d", tc.what, len(raw), tc.limit)
		}
		if !truncated && len(w.msg.Answer) != tc.records {
			t.Errorf("%s: %d records, want %d", tc.what, len(w.msg.Answer), tc.records)
		}
	}
}
