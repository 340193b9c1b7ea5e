package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Bounds on what one DNS-SD lookup may produce, so a hostile or broken
// zone costs a bounded amount of work.
const (
	maxDNSInstances = 32
	maxDNSTargets   = 64
)

// dnsResolver asks one DNS server, over UDP and over TCP when the answer
// is truncated.
type dnsResolver struct {
	server string
	udp    *dns.Client
	tcp    *dns.Client
}

func newDNSResolver(server string) (*dnsResolver, error) {
	if server == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("discovery: DNS-SD: no --dns-server and /etc/resolv.conf unreadable: %w", err)
		}
		if len(cc.Servers) == 0 {
			return nil, errors.New("discovery: DNS-SD: /etc/resolv.conf names no nameserver")
		}
		server = net.JoinHostPort(cc.Servers[0], cc.Port)
	}
	if _, _, err := net.SplitHostPort(server); err != nil {
		server = net.JoinHostPort(server, "53")
	}
	return &dnsResolver{
		server: server,
		udp:    &dns.Client{Net: "udp", Timeout: 2 * time.Second},
		tcp:    &dns.Client{Net: "tcp", Timeout: 2 * time.Second},
	}, nil
}

// dnsName returns dom as a fully qualified name, or false.
func dnsName(dom string) (string, bool) {
	fq := dns.Fqdn(strings.TrimSpace(dom))
	if fq == "." {
		return "", false
	}
	_, ok := dns.IsDomainName(fq)
	return fq, ok
}

// query returns the answer to one question; a name that does not exist is
// an empty answer, not an error.
func (r *dnsResolver) query(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	q.RecursionDesired = true
	resp, _, err := r.udp.ExchangeContext(ctx, q, r.server)
	if err == nil && resp.Truncated {
		resp, _, err = r.tcp.ExchangeContext(ctx, q, r.server)
	}
	if err != nil {
		return nil, fmt.Errorf("query %s %s at %s: %w", dns.TypeToString[qtype], name, r.server, err)
	}
	switch resp.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
		return resp, nil
	}
	return nil, fmt.Errorf("query %s %s at %s: %s", dns.TypeToString[qtype], name, r.server, dns.RcodeToString[resp.Rcode])
}

// dnsLoop resolves every domain at start and then every ResolveInterval.
func (d *Discovery) dnsLoop(ctx context.Context, r *dnsResolver) {
	for {
		for _, dom := range d.cfg.DNSDomains {
			d.resolveDomain(ctx, r, dom)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(d.cfg.ResolveInterval)):
		}
	}
}

func (d *Discovery) dnsDrop(reason, name string, err error) {
	d.metrics.candidateDrop.WithLabelValues(string(SourceDNS), reason).Inc()
	d.log.Debug("DNS-SD answer ignored", "name", truncate(name, 80), "reason", reason, "err", err)
}

// resolveDomain browses _flotilla._udp.<dom> (PTR, RFC 6763), reads the
// SRV records of the instances found and of the service name itself, and
// adds the targets' addresses as candidates.
func (d *Discovery) resolveDomain(ctx context.Context, r *dnsResolver, dom string) {
	fq, _ := dnsName(dom)
	svc := ServiceName + "." + fq
	var srvs []*dns.SRV
	var extra []dns.RR

	if resp, err := r.query(ctx, svc, dns.TypePTR); err != nil {
		d.dnsDrop("query_failed", svc, err)
	} else {
		n := 0
		for _, rr := range resp.Answer {
			ptr, ok := rr.(*dns.PTR)
			if !ok {
				continue
			}
			if n++; n > maxDNSInstances {
				d.dnsDrop("too_many", svc, fmt.Errorf("more than %d instances", maxDNSInstances))
				break
			}
			inst := ptr.Ptr
			if !d.dnsInstanceOurs(ctx, r, inst) {
				continue
			}
			resp, err := r.query(ctx, inst, dns.TypeSRV)
			if err != nil {
				d.dnsDrop("query_failed", inst, err)
				continue
			}
			srvs = append(srvs, srvsOf(resp)...)
			extra = append(extra, resp.Extra...)
		}
	}
	if resp, err := r.query(ctx, svc, dns.TypeSRV); err != nil {
		d.dnsDrop("query_failed", svc, err)
	} else {
		srvs = append(srvs, srvsOf(resp)...)
		extra = append(extra, resp.Extra...)
	}
	if len(srvs) > maxDNSTargets {
		d.dnsDrop("too_many", svc, fmt.Errorf("%d SRV records, using %d", len(srvs), maxDNSTargets))
		srvs = srvs[:maxDNSTargets]
	}
	seen := map[string]bool{}
	for _, srv := range srvs {
		key := srv.Target + ":" + strconv.Itoa(int(srv.Port))
		if seen[key] {
			continue
		}
		seen[key] = true
		if srv.Target == "." {
			d.dnsDrop("srv_no_service", srv.Hdr.Name, errors.New(`target "." means the service is not offered`))
			continue
		}
		if srv.Port == 0 {
			d.dnsDrop("bad_port", srv.Hdr.Name, errors.New("port 0"))
			continue
		}
		addrs := d.dnsAddrs(ctx, r, srv.Target, extra)
		if len(addrs) == 0 {
			d.dnsDrop("srv_unresolved", srv.Target, errors.New("target has no usable A or AAAA record"))
			continue
		}
		for _, a := range addrs {
			ap := netip.AddrPortFrom(a, srv.Port).String()
			if d.cands.add(ap, SourceDNS, 3*d.cfg.ResolveInterval) {
				d.metrics.found.WithLabelValues(string(SourceDNS)).Inc()
				d.log.Debug("DNS-SD candidate", "addr", ap, "srv", srv.Hdr.Name)
			}
		}
	}
}

// dnsInstanceOurs checks an instance's TXT fingerprints when it has them;
// instances without TXT records are accepted (gossip encryption decides).
func (d *Discovery) dnsInstanceOurs(ctx context.Context, r *dnsResolver, inst string) bool {
	resp, err := r.query(ctx, inst, dns.TypeTXT)
	if err != nil {
		return true
	}
	var fields []string
	for _, rr := range resp.Answer {
		if t, ok := rr.(*dns.TXT); ok {
			fields = append(fields, t.Txt...)
		}
	}
	if len(fields) == 0 {
		return true
	}
	adv, err := parseTXT(fields)
	if err != nil {
		if strings.Contains(strings.Join(fields, " "), txtFingerprint+"=") {
			d.dnsDrop("malformed_txt", inst, err)
			return false
		}
		return true
	}
	if adv.clusterID == d.selfID {
		return false
	}
	if !d.sameFederation(adv.fingerprints) {
		d.dnsDrop("other_federation", inst, fmt.Errorf("fingerprints %v", adv.fingerprints))
		return false
	}
	return true
}

func srvsOf(resp *dns.Msg) []*dns.SRV {
	var out []*dns.SRV
	for _, rr := range resp.Answer {
		if s, ok := rr.(*dns.SRV); ok {
			out = append(out, s)
		}
	}
	return out
}

// dnsAddrs returns the usable addresses of target, from the additional
// section when the server sent them, else by asking for A and AAAA.
func (d *Discovery) dnsAddrs(ctx context.Context, r *dnsResolver, target string, extra []dns.RR) []netip.Addr {
	addrs := addrsOf(target, extra)
	if len(addrs) > 0 {
		return addrs
	}
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		resp, err := r.query(ctx, target, qt)
		if err != nil {
			continue
		}
		addrs = append(addrs, addrsOf("", resp.Answer)...)
	}
	return addrs
}

// addrsOf collects usable A/AAAA addresses, of name when it is not empty.
func addrsOf(name string, rrs []dns.RR) []netip.Addr {
	var out []netip.Addr
	for _, rr := range rrs {
		if name != "" && !strings.EqualFold(rr.Header().Name, name) {
			continue
		}
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			ip = v.A
		case *dns.AAAA:
			ip = v.AAAA
		default:
			continue
		}
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		a = a.Unmap()
		if a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, a)
		if len(out) >= 8 {
			break
		}
	}
	return out
}
