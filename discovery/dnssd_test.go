package discovery

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// zoneServer is a small authoritative DNS server over UDP on loopback.
type zoneServer struct {
	mu      sync.Mutex
	records map[string][]dns.RR // "name TYPE" -> answers
	queries int
	addr    string
}

func startZoneServer(t *testing.T, zone []string) *zoneServer {
	t.Helper()
	z := &zoneServer{}
	z.set(t, zone)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		resp := new(dns.Msg)
		resp.SetReply(q)
		resp.Authoritative = true
		z.mu.Lock()
		z.queries++
		if len(q.Question) == 1 {
			qq := q.Question[0]
			resp.Answer = z.records[strings.ToLower(qq.Name)+" "+dns.TypeToString[qq.Qtype]]
			if len(resp.Answer) == 0 {
				resp.Rcode = dns.RcodeNameError
			}
		}
		z.mu.Unlock()
		_ = w.WriteMsg(resp)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return z
}

// set replaces the zone's records.
func (z *zoneServer) set(t *testing.T, zone []string) {
	t.Helper()
	records := map[string][]dns.RR{}
	for _, line := range zone {
		rr, err := dns.NewRR(line)
		if err != nil {
			t.Fatalf("zone line %q: %v", line, err)
		}
		key := strings.ToLower(rr.Header().Name) + " " + dns.TypeToString[rr.Header().Rrtype]
		records[key] = append(records[key], rr)
	}
	z.mu.Lock()
	z.records = records
	z.mu.Unlock()
}

func TestDNSSDFindsMembersAndCountsBadAnswers(t *testing.T) {
	a := startNode(t, nodeOpts{})
	b := startNode(t, nodeOpts{})
	_, aPort, _ := net.SplitHostPort(a.addr())
	_, bPort, _ := net.SplitHostPort(b.addr())
	fp := Fingerprint(testKey)
	otherFP := Fingerprint(bytes.Repeat([]byte{9}, 32))
	svc := "_flotilla._udp.fed.test."
	zone := []string{
		// PTR browsing (RFC 6763): a is an instance with SRV and TXT.
		svc + " 60 IN PTR a." + svc,
		"a." + svc + " 60 IN SRV 0 0 " + aPort + " a.fed.test.",
		"a." + svc + ` 60 IN TXT "txtvers=1" "id=` + a.id.ClusterID() + `" "fp=` + fp + `"`,
		"a.fed.test. 60 IN A 127.0.0.1",
		// Instances that must be ignored, each for a counted reason.
		svc + " 60 IN PTR ghost." + svc,
		"ghost." + svc + " 60 IN SRV 0 0 7946 ghost.fed.test.", // target has no address
		svc + " 60 IN PTR gone." + svc,
		"gone." + svc + " 60 IN SRV 0 0 7946 .", // "service not offered here"
		svc + " 60 IN PTR foreign." + svc,
		"foreign." + svc + " 60 IN SRV 0 0 7946 a.fed.test.",
		"foreign." + svc + ` 60 IN TXT "id=` + mustIdentity(t).ClusterID() + `" "fp=` + otherFP + `"`,
		svc + " 60 IN PTR mangled." + svc,
		"mangled." + svc + " 60 IN SRV 0 0 7946 a.fed.test.",
		"mangled." + svc + ` 60 IN TXT "id=cnotanid" "fp=zz"`,
		svc + " 60 IN PTR zero." + svc,
		"zero." + svc + " 60 IN SRV 0 0 0 a.fed.test.",
		svc + " 60 IN PTR nowhere." + svc,
		"nowhere." + svc + " 60 IN SRV 0 0 7946 nowhere.fed.test.",
		"nowhere.fed.test. 60 IN A 0.0.0.0",
		// Plain SRV at the service name: b.
		svc + " 60 IN SRV 0 0 " + bPort + " b.fed.test.",
		"b.fed.test. 60 IN A 127.0.0.1",
	}
	z := startZoneServer(t, zone)
	c := startNode(t, nodeOpts{domains: []string{"fed.test"}, dns: z.addr})
	waitUntil(t, 20*time.Second, func() error { return sees(c, a, b) })

	for _, reason := range []string{"srv_unresolved", "srv_no_service", "other_federation", "malformed_txt", "bad_port"} {
		if got := metricValue(t, c.reg, "flotilla_discovery_candidates_dropped_total", "source=dns", "reason="+reason); got == 0 {
			t.Errorf("no DNS answer dropped for %s", reason)
		}
	}
	if got := metricValue(t, c.reg, "flotilla_discovery_candidates_found_total", "source=dns"); got != 2 {
		t.Errorf("DNS candidates found = %v, want 2 (a and b)", got)
	}
	for _, cand := range c.d.Snapshot().Candidates {
		if strings.HasPrefix(cand.Addr, "0.0.0.0") {
			t.Errorf("candidate %s points nowhere", cand.Addr)
		}
	}
	// Re-resolved periodically, at a bounded rate.
	z.mu.Lock()
	before := z.queries
	z.mu.Unlock()
	time.Sleep(2500 * time.Millisecond)
	z.mu.Lock()
	after := z.queries
	z.mu.Unlock()
	if after == before {
		t.Error("domain not re-resolved")
	}
	if per := after - before; per > 3*len(zone) {
		t.Errorf("%d queries in 2.5 s: lookups are not paced", per)
	}
}

func TestDNSSDUnreachableServerIsNotFatal(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent := pc.LocalAddr().String() // answers nothing
	defer pc.Close()
	a := startNode(t, nodeOpts{})
	c := startNode(t, nodeOpts{domains: []string{"fed.test"}, dns: silent, seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(c, a) })
	waitUntil(t, 20*time.Second, func() error {
		if got := metricValue(t, c.reg, "flotilla_discovery_candidates_dropped_total", "source=dns", "reason=query_failed"); got == 0 {
			return fmt.Errorf("DNS timeouts not counted")
		}
		return nil
	})
}
