package discovery

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestOnLAN(t *testing.T) {
	for _, tc := range []struct {
		addr string
		lan  bool
	}{
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"100.64.0.1", true},
		{"198.18.0.7", true},
		{"169.254.1.1", true},
		{"fd00::1", true},
		{"::ffff:192.168.1.1", true},
		{"fe80::1", false}, // no interface in the answer
		{"8.8.8.8", false},
		{"203.0.113.9", false},
		{"127.0.0.1", false},
		{"224.0.0.251", false},
		{"0.0.0.0", false},
		{"2001:db8::1", false},
	} {
		if got := onLAN(netip.MustParseAddr(tc.addr)); got != tc.lan {
			t.Errorf("onLAN(%s) = %v, want %v", tc.addr, got, tc.lan)
		}
	}
}

// stormAnswer is one spoofed mDNS answer naming instances of the
// federation (its fingerprint, as any host on the LAN hears it in the
// adverts), each at the addresses addrs(i).
func stormAnswer(t *testing.T, fp string, instances int, prefix string, addrs func(i int) []net.IP) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.Response = true
	hdr := func(name string, rrtype uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: 120}
	}
	service := ServiceName + "." + mdnsDomain
	for i := range instances {
		inst := fmt.Sprintf("%s-%d.%s", prefix, i, service)
		host := fmt.Sprintf("%s-%d.local.", prefix, i)
		id := strings.Repeat("c", 27)
		m.Answer = append(m.Answer, &dns.PTR{Hdr: hdr(service, dns.TypePTR), Ptr: inst})
		m.Extra = append(m.Extra,
			&dns.SRV{Hdr: hdr(inst, dns.TypeSRV), Port: 7946, Target: host},
			&dns.TXT{Hdr: hdr(inst, dns.TypeTXT), Txt: []string{"txtvers=1", "id=" + id, "fp=" + fp, "v=3"}})
		for _, a := range addrs(i) {
			m.Extra = append(m.Extra, &dns.A{Hdr: hdr(host, dns.TypeA), A: a})
		}
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A storm of spoofed mDNS answers, from a thousand LAN addresses and from
// the internet, naming many instances each at addresses on and off the
// LAN: the candidates mDNS gives stay within their cap and on the LAN,
// each refusal is counted by reason, and the member stays alive.
func TestMDNSStormIsCapped(t *testing.T) {
	a := startNode(t, nodeOpts{})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	if err := validateClusterIDForStorm(); err != nil {
		t.Fatal(err)
	}
	fp := fingerprints(a.d.keyring.GetKeys())[0]
	dropped := func(reason string) float64 {
		return metricValue(t, a.reg, "flotilla_discovery_candidates_dropped_total", "source=mdns", "reason="+reason)
	}

	const sources, perSource, perBrowse = 1000, 10, 100
	var state *browseState
	for s := range sources {
		if s%perBrowse == 0 {
			state = newBrowseState(ServiceName + "." + mdnsDomain) // a new browse every 100 answers
		}
		src := netip.AddrFrom4([4]byte{10, 77, byte(s >> 8), byte(s)})
		pkt := stormAnswer(t, fp, perSource, fmt.Sprintf("s%d", s), func(i int) []net.IP {
			return []net.IP{
				net.IPv4(10, 200, byte(s>>8), byte(s)), net.IPv4(10, 201, byte(s>>8), byte(s)),
				net.IPv4(10, 202, byte(s>>8), byte(s)), net.IPv4(10, 203, byte(s>>8), byte(s)),
				net.IPv4(10, 204, byte(s>>8), byte(s)), // past maxAddrsPerInstance
				net.IPv4(8, 8, byte(i), byte(s)),       // off the LAN
			}
		})
		a.d.mdnsAnswer(state, src, pkt)
	}
	// From the internet, and from the LAN naming the internet only.
	offLAN := func(int) []net.IP { return []net.IP{net.IPv4(203, 0, 113, 9)} }
	for s := range 50 {
		a.d.mdnsAnswer(newBrowseState(ServiceName+"."+mdnsDomain), netip.AddrFrom4([4]byte{203, 0, 113, byte(s)}), stormAnswer(t, fp, 1, fmt.Sprintf("i%d", s), offLAN))
		a.d.mdnsAnswer(newBrowseState(ServiceName+"."+mdnsDomain), netip.AddrFrom4([4]byte{192, 168, 9, byte(s)}), stormAnswer(t, fp, 1, fmt.Sprintf("o%d", s), offLAN))
	}

	var mdns int
	for _, c := range a.d.cands.list() {
		if !(len(c.Sources) == 1 && c.Sources[0] == SourceMDNS) {
			continue
		}
		mdns++
		ap := netip.MustParseAddrPort(c.Addr)
		if !onLAN(ap.Addr()) {
			t.Errorf("candidate %s is off the LAN", c.Addr)
		}
		if ap.Addr().As4()[1] == 204 {
			t.Errorf("candidate %s is an instance's fifth address", c.Addr)
		}
	}
	if mdns != maxMDNSCandidates {
		t.Errorf("%d candidates from mDNS, want the cap, %d", mdns, maxMDNSCandidates)
	}
	if got := metricValue(t, a.reg, "flotilla_discovery_candidates", "source=mdns"); got != maxMDNSCandidates {
		t.Errorf("flotilla_discovery_candidates{source=mdns} %v, want %d", got, maxMDNSCandidates)
	}
	for reason, want := range map[string]float64{
		// Of each browse's 100 sources, the first 32 had places for 4 of
		// their 10 instances; from the 33rd on, the browse knew 128.
		reasonSourceCap: 320,
		reasonTooMany:   680,
		reasonNotLAN:    100, // 50 answers from the internet, 50 naming it only
	} {
		if got := dropped(reason); got != want {
			t.Errorf("dropped for %s: %v, want %v", reason, got, want)
		}
	}
	if dropped(reasonCandidatesFull) == 0 {
		t.Errorf("no instance dropped for %s", reasonCandidatesFull)
	}
	if err := sees(a, b); err != nil {
		t.Fatal(err)
	}
}

// validateClusterIDForStorm checks that the storm's cluster ID passes
// parseTXT, so the answers are refused for the bounds and not for it.
func validateClusterIDForStorm() error {
	_, err := parseTXT([]string{"id=" + strings.Repeat("c", 27), "fp=0011223344556677"})
	return err
}

// One source naming many host names first cannot keep another source's
// instance from completing in the same browse.
func TestMDNSHostNamesCappedPerSource(t *testing.T) {
	b := newBrowseState(ServiceName + "." + mdnsDomain)
	var junk []dns.RR
	for i := range 2 * maxBrowseNames {
		junk = append(junk, &dns.A{Hdr: dns.RR_Header{Name: fmt.Sprintf("junk-%d.local.", i), Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(10, 9, 0, byte(i))})
	}
	if refused := b.add(netip.MustParseAddr("10.9.0.1"), junk); len(refused) != 1 || refused[0] != reasonSourceCap {
		t.Errorf("junk host names refused for %v, want %s", refused, reasonSourceCap)
	}
	rrs, ok := unpackResponse(stormAnswer(t, "0011223344556677", 1, "real", func(int) []net.IP { return []net.IP{net.IPv4(10, 1, 1, 1)} }))
	if !ok {
		t.Fatal("answer not parsed")
	}
	if refused := b.add(netip.MustParseAddr("10.1.1.1"), rrs); len(refused) != 0 {
		t.Errorf("a real answer refused for %v", refused)
	}
	if ready := b.ready(); len(ready) != 1 || !ready[0].addrs[0].Equal(net.IPv4(10, 1, 1, 1)) {
		t.Errorf("ready: %+v, want the real instance", ready)
	}
}
