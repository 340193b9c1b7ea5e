package discovery

import (
	"net"

	"github.com/miekg/dns"
	"golang.org/x/net/dns/dnsmessage"
)

// unpackResponse parses an mDNS response and returns the records a browse
// needs. miekg/dns rejects a whole packet for one record it finds
// malformed, and some responders send NSEC records whose type bitmap has
// an empty window (python-zeroconf does), so when the strict parse fails
// the packet is read again, keeping PTR, SRV, TXT, A and AAAA records and
// skipping the rest.
func unpackResponse(b []byte) ([]dns.RR, bool) {
	var m dns.Msg
	if err := m.Unpack(b); err == nil {
		return append(m.Answer, m.Extra...), m.Response
	}
	var p dnsmessage.Parser
	h, err := p.Start(b)
	if err != nil || !h.Response {
		return nil, false
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, false
	}
	var out []dns.RR
	section := func(next func() (dnsmessage.ResourceHeader, error), skip func() error) bool {
		for {
			rh, err := next()
			if err == dnsmessage.ErrSectionDone {
				return true
			}
			if err != nil {
				return false
			}
			rr, err := convert(&p, rh)
			if err != nil {
				return false
			}
			if rr == nil {
				if err := skip(); err != nil {
					return false
				}
				continue
			}
			out = append(out, rr)
		}
	}
	if !section(p.AnswerHeader, p.SkipAnswer) || p.SkipAllAuthorities() != nil || !section(p.AdditionalHeader, p.SkipAdditional) {
		return out, len(out) > 0
	}
	return out, true
}

// convert reads the body of a record browse needs into a miekg/dns RR, or
// returns nil, leaving the body for the caller to skip.
func convert(p *dnsmessage.Parser, h dnsmessage.ResourceHeader) (dns.RR, error) {
	hdr := dns.RR_Header{Name: h.Name.String(), Class: uint16(h.Class), Ttl: h.TTL}
	switch h.Type {
	case dnsmessage.TypePTR:
		r, err := p.PTRResource()
		hdr.Rrtype = dns.TypePTR
		return &dns.PTR{Hdr: hdr, Ptr: r.PTR.String()}, err
	case dnsmessage.TypeSRV:
		r, err := p.SRVResource()
		hdr.Rrtype = dns.TypeSRV
		return &dns.SRV{Hdr: hdr, Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: r.Target.String()}, err
	case dnsmessage.TypeTXT:
		r, err := p.TXTResource()
		hdr.Rrtype = dns.TypeTXT
		return &dns.TXT{Hdr: hdr, Txt: r.TXT}, err
	case dnsmessage.TypeA:
		r, err := p.AResource()
		hdr.Rrtype = dns.TypeA
		return &dns.A{Hdr: hdr, A: net.IP(r.A[:])}, err
	case dnsmessage.TypeAAAA:
		r, err := p.AAAAResource()
		hdr.Rrtype = dns.TypeAAAA
		return &dns.AAAA{Hdr: hdr, AAAA: net.IP(r.AAAA[:])}, err
	}
	return nil, nil
}
