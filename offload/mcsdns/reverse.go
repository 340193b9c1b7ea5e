package mcsdns

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// The reverse zones a PTR name ends in.
const (
	reverse4 = "in-addr.arpa."
	reverse6 = "ip6.arpa."
)

// ptrName is one name an address answers with in reverse: the
// Service's own (a ClusterSetIP) or, for a headless endpoint,
// "hostname.clusterid" before it.
type ptrName struct {
	addr netip.Addr
	host string
}

// reverseAddr is the address a whole reverse name (lowercase, fully
// qualified) asks about: d.c.b.a.in-addr.arpa. or 32 nibbles then
// ip6.arpa. Anything else, shorter names included, is not one. It reads
// a name any client sent, so it must take anything.
func reverseAddr(qname string) (netip.Addr, bool) {
	if rest, ok := strings.CutSuffix(qname, "."+reverse4); ok {
		labels := strings.Split(rest, ".")
		if len(labels) != 4 {
			return netip.Addr{}, false
		}
		var b [4]byte
		for i, l := range labels {
			// Decimal without leading zeros, as the address is written.
			n, err := strconv.ParseUint(l, 10, 8)
			if err != nil || strconv.FormatUint(n, 10) != l {
				return netip.Addr{}, false
			}
			b[3-i] = byte(n)
		}
		return netip.AddrFrom4(b), true
	}
	if rest, ok := strings.CutSuffix(qname, "."+reverse6); ok {
		labels := strings.Split(rest, ".")
		if len(labels) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i, l := range labels {
			if len(l) != 1 {
				return netip.Addr{}, false
			}
			n, err := strconv.ParseUint(l, 16, 8)
			if err != nil {
				return netip.Addr{}, false
			}
			b[15-i/2] |= byte(n) << (4 * (i % 2))
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}

// indexPTR adds (or, add false, removes) the reverse names of s, the
// Service whose name is base, in t.ptrs; t.mu is held.
func (t *table) indexPTR(base string, s *service, add bool) {
	for _, p := range s.ptrs {
		target := base
		if p.host != "" {
			target = p.host + "." + base
		}
		names := t.ptrs[p.addr]
		i, found := slices.BinarySearch(names, target)
		switch {
		case add && !found:
			t.ptrs[p.addr] = slices.Insert(names, i, target)
		case !add && found:
			if names = slices.Delete(names, i, i+1); len(names) == 0 {
				delete(t.ptrs, p.addr)
			} else {
				t.ptrs[p.addr] = names
			}
		}
	}
}

// answerReverse answers a reverse name: the clusterset names of the
// address, which is a ClusterSetIP or a headless Service's endpoint
// here; an address that is neither is refused, as every name this
// server has no records for outside its zone. t.mu is read-locked.
func (t *table) answerReverse(addr netip.Addr, qname string, qtype uint16, resp *dns.Msg) {
	names := t.ptrs[addr]
	if len(names) == 0 {
		resp.Rcode = dns.RcodeRefused
		return
	}
	resp.Authoritative = true
	switch qtype {
	case dns.TypePTR:
		for _, n := range names {
			resp.Answer = append(resp.Answer, &dns.PTR{Hdr: header(qname, dns.TypePTR), Ptr: n})
		}
	case dns.TypeANY:
		resp.Answer = []dns.RR{&dns.HINFO{Hdr: header(qname, dns.TypeHINFO), Cpu: "RFC8482"}}
	}
}
