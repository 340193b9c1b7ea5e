package discovery

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// zeroconfStyleResponse packs an answer for one instance and appends an
// NSEC record whose type bitmap holds an empty window, as python-zeroconf
// sends.
func zeroconfStyleResponse(t testing.TB) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.Response, m.Authoritative = true, true
	inst := "x._flotilla._udp.local."
	m.Answer = []dns.RR{&dns.PTR{Hdr: dns.RR_Header{Name: "_flotilla._udp.local.", Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: 120}, Ptr: inst}}
	m.Extra = []dns.RR{
		&dns.SRV{Hdr: dns.RR_Header{Name: inst, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 120}, Port: 7946, Target: "x.local."},
		&dns.TXT{Hdr: dns.RR_Header{Name: inst, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 120}, Txt: []string{"id=x", "fp=0011223344556677"}},
		&dns.A{Hdr: dns.RR_Header{Name: "x.local.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 120}, A: net.IPv4(198, 18, 1, 9)},
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	// NSEC x.local.: next name = pointer to the header's first name,
	// bitmap = window 0 with length 0.
	nsec := []byte{0xc0, 0x0c, 0, 47, 0x80, 0x01, 0, 0, 0, 120, 0, 4, 0xc0, 0x0c, 0, 0}
	b = append(b, nsec...)
	binary.BigEndian.PutUint16(b[10:], binary.BigEndian.Uint16(b[10:])+1) // ARCOUNT
	return b
}

func TestUnpackResponseSkipsWhatStrictParsingRefuses(t *testing.T) {
	b := zeroconfStyleResponse(t)
	if err := new(dns.Msg).Unpack(b); err == nil {
		t.Fatal("the test packet no longer trips miekg/dns: it tests nothing")
	}
	rrs, ok := unpackResponse(b)
	if !ok {
		t.Fatal("response refused")
	}
	st := newBrowseState("_flotilla._udp.local.")
	st.add(netip.MustParseAddr("192.168.1.2"), rrs)
	ready := st.ready()
	if len(ready) != 1 || ready[0].port != 7946 || !ready[0].addrs[0].Equal(net.IPv4(198, 18, 1, 9)) || len(ready[0].txt) != 2 {
		t.Fatalf("instance not assembled from the lenient parse: %+v", ready)
	}
}

func FuzzUnpackResponse(f *testing.F) {
	f.Add(zeroconfStyleResponse(f))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		rrs, _ := unpackResponse(b)
		st := newBrowseState("_flotilla._udp.local.")
		st.add(netip.MustParseAddr("192.168.1.2"), rrs)
		st.ready()
	})
}
