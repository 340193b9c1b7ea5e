package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/mdns"

	"github.com/flotilla-io/flotilla/peering/identity"
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
		return nil, nil
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
		txtProtocol + "=" + strconv.Itoa(int(ProtocolVersion)),
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

func (d *Discovery) browse(ctx context.Context) {
	entries := make(chan *mdns.ServiceEntry, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range entries {
			d.mdnsEntry(e)
		}
	}()
	params := &mdns.QueryParam{
		Service: ServiceName,
		Domain:  mdnsDomain,
		Timeout: time.Second,
		Entries: entries,
		Logger:  mdnsLogger(d.log),
	}
	if d.mdns != nil {
		params.Interface = d.mdns.iface
	}
	if err := mdns.QueryContext(ctx, params); err != nil && !errors.Is(err, context.Canceled) {
		d.log.Warn("mDNS browse failed", "err", err)
	}
	close(entries)
	<-done
}

// mdnsEntry turns one answer into join candidates, or counts why not.
func (d *Discovery) mdnsEntry(e *mdns.ServiceEntry) {
	if !strings.HasSuffix(strings.ToLower(e.Name), "."+ServiceName+"."+mdnsDomain) {
		return // another service's records in the same packet
	}
	drop := func(reason string, err error) {
		d.metrics.candidateDrop.WithLabelValues(string(SourceMDNS), reason).Inc()
		d.log.Debug("mDNS answer ignored", "name", truncate(e.Name, 80), "reason", reason, "err", err)
	}
	adv, err := parseTXT(e.InfoFields)
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
	if e.Port <= 0 || e.Port > 65535 {
		drop("bad_port", fmt.Errorf("port %d", e.Port))
		return
	}
	var addrs []string
	if e.AddrV4 != nil {
		addrs = append(addrs, net.JoinHostPort(e.AddrV4.String(), strconv.Itoa(e.Port)))
	}
	if e.AddrV6IPAddr != nil && !e.AddrV6IPAddr.IP.IsLinkLocalUnicast() {
		addrs = append(addrs, net.JoinHostPort(e.AddrV6IPAddr.IP.String(), strconv.Itoa(e.Port)))
	}
	if len(addrs) == 0 {
		drop("no_address", errors.New("no usable address"))
		return
	}
	for _, a := range addrs {
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
