package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/mdns"
	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"

	"github.com/flotilla-io/flotilla/identity"
)

// ServiceName is the DNS-SD service type of a Flotilla agent, on mDNS
// (in "local.") and in unicast DNS domains.
const ServiceName = "_flotilla._udp"

const mdnsDomain = "local."

// TXT keys of the advert.
const (
	txtVersion     = "txtvers"
	txtClusterID   = "id"
	txtFingerprint = "fp"
	txtProtocol    = "v"
)

// mdnsAdvert is the running mDNS responder. It is restarted when the
// advert changes (key rotation changes the fingerprints).
type mdnsAdvert struct {
	mu     sync.Mutex
	server *mdns.Server
	iface  *net.Interface
}

func (d *Discovery) mdnsInterface() (*net.Interface, error) {
	if d.cfg.MDNSInterface == "" {
		return interfaceWith(d.ml.LocalNode().Addr), nil
	}
	iface, err := net.InterfaceByName(d.cfg.MDNSInterface)
	if err != nil {
		return nil, fmt.Errorf("discovery: mDNS interface %q: %w", d.cfg.MDNSInterface, err)
	}
	return iface, nil
}

func (d *Discovery) mdnsService() (*mdns.MDNSService, error) {
	self := d.ml.LocalNode()
	host := d.cfg.MDNSHostName
	if host == "" {
		host = d.selfID + ".local."
	}
	if !strings.HasSuffix(host, ".") {
		host += "."
	}
	ip := self.Addr
	if ip.IsUnspecified() {
		return nil, fmt.Errorf("discovery: mDNS needs a specific advertise address, have %s", ip)
	}
	txt := d.txtRecords()
	svc, err := mdns.NewMDNSService(d.selfID, ServiceName, mdnsDomain, host, int(self.Port), []net.IP{ip}, txt)
	if err != nil {
		return nil, fmt.Errorf("discovery: mDNS advert: %w", err)
	}
	return svc, nil
}

// txtRecords are the advert's TXT strings. Nothing in them is secret: the
// fingerprints name the keys without revealing them.
func (d *Discovery) txtRecords() []string {
	return []string{
		txtVersion + "=1",
		txtClusterID + "=" + d.selfID,
		txtFingerprint + "=" + strings.Join(fingerprints(d.keyring.GetKeys()), ","),
		txtProtocol + "=" + strconv.Itoa(int(d.cfg.Protocol)),
	}
}

func (d *Discovery) startMDNS() (*mdnsAdvert, error) {
	iface, err := d.mdnsInterface()
	if err != nil {
		return nil, err
	}
	adv := &mdnsAdvert{iface: iface}
	if err := d.restartMDNS(adv); err != nil {
		return nil, err
	}
	return adv, nil
}

func (d *Discovery) restartMDNS(adv *mdnsAdvert) error {
	svc, err := d.mdnsService()
	if err != nil {
		return err
	}
	adv.mu.Lock()
	defer adv.mu.Unlock()
	if adv.server != nil {
		_ = adv.server.Shutdown()
		adv.server = nil
	}
	srv, err := mdns.NewServer(&mdns.Config{Zone: svc, Iface: adv.iface, Logger: mdnsLogger(d.log)})
	if err != nil {
		return fmt.Errorf("discovery: start mDNS responder: %w", err)
	}
	adv.server = srv
	return nil
}

func (d *Discovery) stopMDNS() {
	if d.mdns == nil {
		return
	}
	d.mdns.mu.Lock()
	defer d.mdns.mu.Unlock()
	if d.mdns.server != nil {
		_ = d.mdns.server.Shutdown()
		d.mdns.server = nil
	}
}

// readvertise republishes the mDNS advert after a keyring change.
func (d *Discovery) readvertise() {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if d.mdns == nil || closed {
		return
	}
	if err := d.restartMDNS(d.mdns); err != nil {
		d.log.Warn("mDNS advert not updated after key change", "err", err)
	}
}

// browseLoop browses at start and then every BrowseInterval.
func (d *Discovery) browseLoop(ctx context.Context) {
	for {
		d.browse(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(d.cfg.BrowseInterval)):
		}
	}
}

// browse sends one DNS-SD query for the service and reads answers for a
// second. The query goes out from an ephemeral port, so every responder
// (hashicorp/mdns, Avahi, mDNSResponder) answers by unicast to it (RFC 6762
// §6.7); no multicast group membership, and so no multicast route, is
// needed to browse.
func (d *Discovery) browse(ctx context.Context) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		d.log.Warn("mDNS browse: open socket", "err", err)
		return
	}
	defer conn.Close()
	pc := ipv4.NewPacketConn(conn)
	if d.mdns != nil && d.mdns.iface != nil {
		if err := pc.SetMulticastInterface(d.mdns.iface); err != nil {
			d.log.Warn("mDNS browse: select interface", "iface", d.mdns.iface.Name, "err", err)
			return
		}
	}
	_ = pc.SetMulticastTTL(255)
	_ = pc.SetMulticastLoopback(true)
	group := &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5353}
	ask := func(name string, types ...uint16) {
		q := new(dns.Msg)
		q.Id = dns.Id()
		q.RecursionDesired = false
		for _, t := range types {
			q.Question = append(q.Question, dns.Question{Name: name, Qtype: t, Qclass: dns.ClassINET})
		}
		b, err := q.Pack()
		if err == nil {
			_, err = conn.WriteToUDP(b, group)
		}
		if err != nil {
			d.log.Debug("mDNS query not sent", "name", name, "err", err)
		}
	}
	service := ServiceName + "." + mdnsDomain
	ask(service, dns.TypePTR)

	b := newBrowseState(service)
	deadline := time.Now().Add(time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	_ = conn.SetReadDeadline(deadline)
	buf := make([]byte, 9000)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return // deadline or cancelled
		}
		for _, inst := range d.mdnsAnswer(b, from.Addr(), buf[:n]) {
			ask(inst, dns.TypeSRV, dns.TypeTXT)
		}
	}
}

// mdnsAnswer reads one answer of a browse from src, turns the instances
// it completes into candidates, and returns the instances to ask about.
func (d *Discovery) mdnsAnswer(b *browseState, src netip.Addr, pkt []byte) []string {
	src = src.Unmap()
	if !onLAN(src) && !src.IsLoopback() {
		d.mdnsDrop(reasonNotLAN, "answer from "+src.String())
		return nil
	}
	rrs, ok := unpackResponse(pkt)
	if !ok {
		return nil
	}
	for _, reason := range b.add(src, rrs) {
		d.mdnsDrop(reason, "an instance named by "+src.String())
	}
	for _, e := range b.ready() {
		d.mdnsEntry(e)
	}
	return b.incomplete()
}

// serviceEntry is one browsed instance.
type serviceEntry struct {
	name  string
	host  string
	port  int
	txt   []string
	addrs []net.IP
}

// browseState assembles instances from answers that may arrive over
// several packets, bounded so a chatty LAN cannot grow it: at most
// maxBrowseNames instances and host names in all, and at most
// maxInstancesPerSource instances and as many host names named first by
// the answers of one source address, so that one host (or one spoofed
// address) cannot take the others' places.
type browseState struct {
	service   string
	instances map[string]*serviceEntry
	hosts     map[string][]net.IP
	done      map[string]bool
	asked     map[string]bool
	bySource  map[netip.Addr]*sourceNames
}

// sourceNames counts the names a source named first in a browse.
type sourceNames struct{ instances, hosts int }

const (
	maxBrowseNames = 128
	// maxInstancesPerSource is generous for a host running a few agents
	// (test sites, one agent per cluster of kind on a laptop).
	maxInstancesPerSource = 4
)

func newBrowseState(service string) *browseState {
	return &browseState{service: service, instances: map[string]*serviceEntry{},
		hosts: map[string][]net.IP{}, done: map[string]bool{}, asked: map[string]bool{},
		bySource: map[netip.Addr]*sourceNames{}}
}

func (b *browseState) source(src netip.Addr) *sourceNames {
	n := b.bySource[src]
	if n == nil {
		n = &sourceNames{}
		b.bySource[src] = n
	}
	return n
}

// instance returns the instance name, created on behalf of src if new;
// nil when it is not of the service, or with the reason it has no place.
func (b *browseState) instance(src netip.Addr, name string) (e *serviceEntry, refused string) {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, "."+b.service) {
		return nil, ""
	}
	e, ok := b.instances[name]
	if !ok {
		switch {
		case b.source(src).instances >= maxInstancesPerSource:
			return nil, reasonSourceCap
		case len(b.instances) >= maxBrowseNames:
			return nil, reasonTooMany
		}
		e = &serviceEntry{name: name}
		b.instances[name] = e
		b.source(src).instances++
	}
	return e, ""
}

// add reads one answer from src and returns the reasons of the records
// that named an instance past a cap, once each.
func (b *browseState) add(src netip.Addr, rrs []dns.RR) (refused []string) {
	note := func(r string) {
		if r != "" && !slices.Contains(refused, r) {
			refused = append(refused, r)
		}
	}
	named := func(name string) *serviceEntry {
		e, r := b.instance(src, name)
		note(r)
		return e
	}
	for _, rr := range rrs {
		switch v := rr.(type) {
		case *dns.PTR:
			if strings.EqualFold(v.Hdr.Name, b.service) {
				named(v.Ptr)
			}
		case *dns.SRV:
			if e := named(v.Hdr.Name); e != nil {
				e.host, e.port = strings.ToLower(v.Target), int(v.Port)
			}
		case *dns.TXT:
			if e := named(v.Hdr.Name); e != nil {
				e.txt = append([]string(nil), v.Txt...)
			}
		case *dns.A:
			note(b.addHost(src, v.Hdr.Name, v.A))
		case *dns.AAAA:
			note(b.addHost(src, v.Hdr.Name, v.AAAA))
		}
	}
	return refused
}

// addHost records an address of host name, on behalf of src if the name
// is new; it returns the reason it has no place, if so.
func (b *browseState) addHost(src netip.Addr, name string, ip net.IP) string {
	name = strings.ToLower(name)
	if _, ok := b.hosts[name]; !ok {
		switch {
		case b.source(src).hosts >= maxInstancesPerSource:
			return reasonSourceCap
		case len(b.hosts) >= maxBrowseNames:
			return reasonTooMany
		}
		b.source(src).hosts++
	}
	for _, have := range b.hosts[name] {
		if have.Equal(ip) {
			return ""
		}
	}
	if len(b.hosts[name]) < 8 {
		b.hosts[name] = append(b.hosts[name], ip)
	}
	return ""
}

// ready returns instances that became complete (port, TXT, an address).
func (b *browseState) ready() []serviceEntry {
	var out []serviceEntry
	for name, e := range b.instances {
		if b.done[name] || e.host == "" || e.txt == nil || len(b.hosts[e.host]) == 0 {
			continue
		}
		b.done[name] = true
		c := *e
		c.addrs = b.hosts[e.host]
		out = append(out, c)
	}
	return out
}

// incomplete returns instances to ask about again, once each.
func (b *browseState) incomplete() []string {
	var out []string
	for name, e := range b.instances {
		if b.done[name] || b.asked[name] || (e.host != "" && e.txt != nil) {
			continue
		}
		b.asked[name] = true
		out = append(out, name)
	}
	return out
}

// Reasons of flotilla_discovery_candidates_dropped_total{source="mdns"}
// for the LAN's bounds.
const (
	reasonNotLAN    = "not_lan"    // an answer from, or an address outside, the LAN's ranges
	reasonSourceCap = "source_cap" // a source named more instances than maxInstancesPerSource
	reasonTooMany   = "too_many"   // a browse heard of maxBrowseNames instances already
	// reasonCandidatesFull: maxMDNSCandidates addresses from mDNS are
	// candidates already.
	reasonCandidatesFull = "candidates_full"
)

// maxAddrsPerInstance bounds the candidates one instance gives: a host
// with an address on each of a few networks.
const maxAddrsPerInstance = 4

// lanPrefixes are the addresses an mDNS answer may come from and name:
// private (RFC 1918, RFC 4193), shared (RFC 6598), benchmarking
// (RFC 2544) and IPv4 link-local, none routed on the internet. A spoofed
// answer cannot make the agent connect out to an address on the internet.
var lanPrefixes = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
}

// onLAN reports whether a is in lanPrefixes. IPv6 link-local addresses
// are not: an answer does not say on which interface they are.
func onLAN(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range lanPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// mdnsDrop counts an mDNS answer, or part of one, ignored for the LAN's
// bounds, and logs it at most once a minute per reason: a storm of
// spoofed answers must not flood the log.
func (d *Discovery) mdnsDrop(reason, what string) {
	d.metrics.candidateDrop.WithLabelValues(string(SourceMDNS), reason).Inc()
	now := time.Now()
	key := "mdns\x00" + reason
	d.mu.Lock()
	last, seen := d.dropLog[key]
	quiet := seen && now.Sub(last) < time.Minute
	if !quiet {
		d.dropLog[key] = now
	}
	d.mu.Unlock()
	if !quiet {
		d.log.Warn("mDNS answers ignored (logged once a minute per reason; flotilla_discovery_candidates_dropped_total counts them)", "reason", reason, "example", what)
	}
}

// mdnsEntry turns one answer into join candidates, or counts why not.
func (d *Discovery) mdnsEntry(e serviceEntry) {
	drop := func(reason string, err error) {
		d.metrics.candidateDrop.WithLabelValues(string(SourceMDNS), reason).Inc()
		d.log.Debug("mDNS answer ignored", "name", truncate(e.name, 80), "reason", reason, "err", err)
	}
	adv, err := parseTXT(e.txt)
	if err != nil {
		drop("malformed_txt", err)
		return
	}
	if adv.clusterID == d.selfID {
		return
	}
	if !d.sameFederation(adv.fingerprints) {
		drop("other_federation", fmt.Errorf("fingerprints %v", adv.fingerprints))
		return
	}
	if e.port <= 0 || e.port > 65535 {
		drop("bad_port", fmt.Errorf("port %d", e.port))
		return
	}
	var addrs []string
	for _, ip := range e.addrs {
		a, ok := netip.AddrFromSlice(ip)
		if !ok || !onLAN(a) || len(addrs) == maxAddrsPerInstance {
			continue
		}
		addrs = append(addrs, net.JoinHostPort(a.Unmap().String(), strconv.Itoa(e.port)))
	}
	if len(addrs) == 0 {
		drop(reasonNotLAN, fmt.Errorf("no address in the LAN's ranges among %v", e.addrs))
		return
	}
	for _, a := range addrs {
		if !d.cands.known(a) && d.cands.fullFor(SourceMDNS) {
			d.mdnsDrop(reasonCandidatesFull, a)
			continue
		}
		if d.cands.add(a, SourceMDNS, 3*d.cfg.BrowseInterval) {
			d.metrics.found.WithLabelValues(string(SourceMDNS)).Inc()
			d.log.Debug("mDNS candidate", "addr", a, "cluster", adv.clusterID)
		}
	}
}

func (d *Discovery) sameFederation(fps []string) bool {
	for _, mine := range fingerprints(d.keyring.GetKeys()) {
		for _, theirs := range fps {
			if mine == theirs {
				return true
			}
		}
	}
	return false
}

type advert struct {
	clusterID    string
	fingerprints []string
	protocol     int
}

// parseTXT reads the advert's TXT strings (RFC 6763 §6: keys are case
// insensitive, the first occurrence of a key wins, unknown keys are
// ignored).
func parseTXT(fields []string) (advert, error) {
	if len(fields) > 32 {
		return advert{}, fmt.Errorf("%d TXT strings, at most 32", len(fields))
	}
	seen := map[string]string{}
	for _, f := range fields {
		if len(f) > 255 {
			return advert{}, fmt.Errorf("TXT string of %d bytes", len(f))
		}
		k, v, _ := strings.Cut(f, "=")
		k = strings.ToLower(k)
		if k == "" {
			continue
		}
		if _, dup := seen[k]; !dup {
			seen[k] = v
		}
	}
	var a advert
	a.clusterID = seen[txtClusterID]
	if err := identity.ValidateClusterID(a.clusterID); err != nil {
		return advert{}, err
	}
	fp := seen[txtFingerprint]
	if fp == "" {
		return advert{}, errors.New("no federation fingerprint")
	}
	for _, f := range strings.Split(fp, ",") {
		if len(f) != 16 || strings.Trim(f, "0123456789abcdef") != "" {
			return advert{}, fmt.Errorf("fingerprint %q is not 16 hex digits", truncate(f, 20))
		}
		a.fingerprints = append(a.fingerprints, f)
	}
	if v, ok := seen[txtProtocol]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 65535 {
			return advert{}, fmt.Errorf("protocol version %q", truncate(v, 20))
		}
		a.protocol = n
	}
	return a, nil
}

// jitter spreads periodic work by ±10%.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + time.Duration(time.Now().UnixNano()%int64(d/5+1))
}

// interfaceWith returns the interface that holds ip, or nil. mDNS runs
// there by default: inside a network namespace without a default route
// the "system multicast interface" does not exist.
func interfaceWith(ip net.IP) *net.Interface {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil
	}
	for i := range ifaces {
		addrs, err := ifaces[i].Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return &ifaces[i]
			}
		}
	}
	return nil
}
