package mcsdns

import (
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"

	"github.com/flotilla-io/flotilla/offload/mcs"
)

// TTL is the time to live of every record: short, so that a resolver's
// cache follows an endpoint that goes within seconds.
const TTL = 5

// NegativeTTL is how long a resolver may keep an answer that a name or a
// type does not exist (RFC 2308: the SOA's minimum, and the TTL of the
// SOA that comes with a negative answer). Shorter than TTL: a client
// that asks for a Service before its import exists, as one waiting for
// it does, gets its address within a second of the import.
const NegativeTTL = 1

// SchemaVersion is the version of KEP-1645's DNS specification served at
// dns-version.clusterset.local.
const SchemaVersion = "1.0.0"

// The SOA's names: there is no real name server in the zone; these say who
// answers, as CoreDNS's kubernetes plugin does for cluster.local.
const (
	soaNS   = "ns.dns." + mcs.Zone
	soaMbox = "hostmaster." + mcs.Zone
)

// table is the zone: the records of every ServiceImport, by namespace and
// name. Lookups read it under a read lock; the watch replaces one
// Service's records at a time.
type table struct {
	mu       sync.RWMutex
	services map[string]*service // by "ns/name"
	// namespaces counts the Services of each namespace with records
	// (<ns>.svc is an empty non-terminal while it has one).
	namespaces map[string]int
	// ptrs are the reverse names: each address's clusterset names,
	// sorted.
	ptrs   map[netip.Addr][]string
	serial uint32
}

func newTable(serial uint32) *table {
	return &table{services: map[string]*service{}, namespaces: map[string]int{}, ptrs: map[netip.Addr][]string{}, serial: serial}
}

// set replaces the records of the Service key (ns/name); nil removes
// them.
func (t *table) set(key string, s *service) {
	ns, svc, _ := strings.Cut(key, "/")
	base := svc + "." + ns + "." + svcSuffix
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.services[key]
	if old == nil && s == nil {
		return
	}
	if old != nil {
		t.indexPTR(base, old, false)
	}
	if s != nil {
		t.indexPTR(base, s, true)
	}
	switch {
	case s == nil:
		delete(t.services, key)
		if t.namespaces[ns]--; t.namespaces[ns] <= 0 {
			delete(t.namespaces, ns)
		}
	case old == nil:
		t.services[key] = s
		t.namespaces[ns]++
	default:
		t.services[key] = s
	}
	t.serial++
}

// answer fills resp (a reply to req, with its question) from the table.
func (t *table) answer(req, resp *dns.Msg) {
	q := req.Question[0]
	qname := strings.ToLower(q.Name)
	t.mu.RLock()
	defer t.mu.RUnlock()
	if addr, ok := reverseAddr(qname); ok {
		t.answerReverse(addr, q.Name, q.Qtype, resp)
		return
	}
	if !inZone(qname) {
		resp.Rcode = dns.RcodeRefused
		return
	}
	resp.Authoritative = true
	rrs, exists := t.lookup(parseName(qname), q.Name, q.Qtype)
	if !exists {
		resp.Rcode = dns.RcodeNameError
	}
	if len(rrs) > 0 && q.Qtype == dns.TypeANY {
		// RFC 8482: one synthesized record instead of every record of
		// the name, so that ANY is no amplifier.
		rrs = []dns.RR{&dns.HINFO{Hdr: header(q.Name, dns.TypeHINFO), Cpu: "RFC8482"}}
	}
	resp.Answer = rrs
	if len(rrs) == 0 {
		resp.Ns = []dns.RR{t.soa(NegativeTTL)}
		return
	}
	if q.Qtype == dns.TypeSRV {
		resp.Extra = t.targets(rrs)
	}
}

// lookup returns the records of type qtype at n (owner qname as asked)
// and whether the name exists at all.
func (t *table) lookup(n name, qname string, qtype uint16) ([]dns.RR, bool) {
	switch n.kind {
	case nameApex:
		if qtype == dns.TypeSOA || qtype == dns.TypeANY {
			return []dns.RR{t.soa(TTL)}, true
		}
		return nil, true
	case nameVersion:
		if qtype == dns.TypeTXT || qtype == dns.TypeANY {
			return []dns.RR{&dns.TXT{Hdr: header(qname, dns.TypeTXT), Txt: []string{SchemaVersion}}}, true
		}
		return nil, true
	case nameSvc:
		return nil, len(t.services) > 0
	case nameNS:
		return nil, t.namespaces[n.ns] > 0
	}
	s := t.services[n.key()]
	if s == nil {
		return nil, false
	}
	switch n.kind {
	case nameService:
		if qtype == dns.TypeSRV {
			return srvRecords(qname, n.svc+"."+n.ns+"."+svcSuffix, s.bare), true
		}
		return addrRecords(qname, qtype, s.addrs), true
	case nameMiddle:
		// <clusterid>.<svc>... exists only for a headless Service's hosts:
		// a ClusterSetIP has no per-cluster name (specification 2.3.4).
		return nil, s.clusters[n.first] || s.protos[n.first]
	case nameSRV:
		targets, ok := s.srv[n.first+"."+n.second]
		if !ok {
			return nil, false
		}
		if qtype != dns.TypeSRV && qtype != dns.TypeANY {
			return nil, true
		}
		return srvRecords(qname, n.svc+"."+n.ns+"."+svcSuffix, targets), true
	case nameHost:
		addrs, ok := s.hosts[n.first+"."+n.second]
		if !ok {
			return nil, false
		}
		return addrRecords(qname, qtype, addrs), true
	}
	return nil, false
}

// srvRecords are SRV records at qname for targets, relative to base (the
// Service's name).
func srvRecords(qname, base string, targets []srvTarget) []dns.RR {
	rrs := make([]dns.RR, 0, len(targets))
	for _, tg := range targets {
		target := base
		if tg.target != "" {
			target = tg.target + "." + base
		}
		rrs = append(rrs, &dns.SRV{Hdr: header(qname, dns.TypeSRV), Priority: 0, Weight: 100, Port: tg.port, Target: target})
	}
	return rrs
}

// targets are the addresses of SRV records' targets, for the additional
// section: a client learns them without asking again.
func (t *table) targets(srvs []dns.RR) []dns.RR {
	var extra []dns.RR
	seen := map[string]bool{}
	for _, rr := range srvs {
		target := rr.(*dns.SRV).Target
		if seen[target] {
			continue
		}
		seen[target] = true
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			rrs, _ := t.lookup(parseName(target), target, qt)
			extra = append(extra, rrs...)
		}
	}
	return extra
}

// soa is the zone's SOA with the time to live ttl: NegativeTTL in the
// authority section of a negative answer, whose TTL a resolver takes as
// the time it may keep that answer (RFC 2308, section 5); its minimum is
// NegativeTTL.
func (t *table) soa(ttl uint32) dns.RR {
	hdr := header(mcs.Zone, dns.TypeSOA)
	hdr.Ttl = ttl
	return &dns.SOA{
		Hdr: hdr, Ns: soaNS, Mbox: soaMbox, Serial: t.serial,
		Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: NegativeTTL,
	}
}

func addrRecords(qname string, qtype uint16, addrs []netip.Addr) []dns.RR {
	var rrs []dns.RR
	for _, a := range addrs {
		switch {
		case a.Is4() && (qtype == dns.TypeA || qtype == dns.TypeANY):
			rrs = append(rrs, &dns.A{Hdr: header(qname, dns.TypeA), A: a.AsSlice()})
		case a.Is6() && (qtype == dns.TypeAAAA || qtype == dns.TypeANY):
			rrs = append(rrs, &dns.AAAA{Hdr: header(qname, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	return rrs
}

func header(owner string, rrtype uint16) dns.RR_Header {
	return dns.RR_Header{Name: owner, Rrtype: rrtype, Class: dns.ClassINET, Ttl: TTL}
}
