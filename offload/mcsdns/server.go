// Package mcsdns answers the clusterset.local zone of the Multi-Cluster
// Services API (KEP-1645's DNS specification) from this cluster's
// ServiceImports and their EndpointSlices, so that CoreDNS can forward
// the zone to the agent (docs/services.md, "DNS").
package mcsdns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/sourcerate"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxUDPAnswer is the largest answer sent over UDP, whatever size the
// client's EDNS0 offers: 1232 bytes fit every path without IP
// fragmentation (DNS Flag Day 2020), so a spoofed query cannot make the
// server send large fragmented answers to its victim. Larger answers are
// truncated (TC) and the client asks again over TCP.
const maxUDPAnswer = 1232

// Defaults of the per-client limit (Config.ClientRate, ClientBurst): a
// CoreDNS replica forwards every lookup of the zone its cache does not
// hold from one address, so the limit is well above what a cluster's
// resolvers ask, and well below what the server answers (tens of
// thousands a second): one client cannot take it all, nor aim its
// answers at a victim whose address it spoofs.
const (
	DefaultClientRate  = 2000
	DefaultClientBurst = 4000
	// clients bounds the addresses whose buckets are kept.
	clients = 4096
)

// DefaultPort is where the agent answers the zone (--clusterset-dns-port):
// not 53, which the node's own resolver may hold, the agent being in the
// host network.
const DefaultPort = 10053

// Config is what a Server needs.
type Config struct {
	// Config reaches the local API server.
	Config *rest.Config
	// Address is where the server listens, UDP and TCP (the gateway
	// node's address, where CoreDNS forwards the zone). Port 0 picks a
	// free one (tests); Addr says which.
	Address netip.AddrPort
	// ClientRate and ClientBurst bound the queries of one client address,
	// a second and at once (DefaultClientRate and DefaultClientBurst
	// when 0). Past them a UDP query is dropped (no answer to reflect at
	// a spoofed address) and a TCP one answered REFUSED.
	ClientRate  float64
	ClientBurst int

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Server is the zone's DNS server: it listens from New on, and answers
// once Run has read every ServiceImport (SERVFAIL before, so that a
// resolver does not cache a name as missing that merely is not read yet).
type Server struct {
	cfg     Config
	log     *slog.Logger
	zone    *table
	udp     net.PacketConn
	tcp     net.Listener
	synced  chan struct{}
	queries *prometheus.CounterVec
	// truncated counts UDP answers cut to fit (TC set).
	truncated prometheus.Counter
	// perClient limits each client address; limited counts the queries
	// past it, by transport.
	perClient *sourcerate.Limiter
	limited   *prometheus.CounterVec
	// limitLogged is when a limited client was last logged.
	limitLogged atomic.Int64
	// loop rebuilds the records of one Service at a time from imported,
	// the cache watch starts before the loop's workers.
	loop     *ctrl.Controller[string]
	imported client.Reader
}

// New binds the server's sockets, so that a taken port fails at once; Run
// serves them (and closes them when it returns).
func New(cfg Config) (*Server, error) {
	if cfg.Config == nil {
		return nil, errors.New("clusterset DNS: the local REST config is required")
	}
	if !cfg.Address.IsValid() {
		return nil, fmt.Errorf("clusterset DNS: address %q: want host:port", cfg.Address)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger.With("component", "clusterset-dns"),
		// The serial only grows while the agent runs; starting from the
		// clock keeps it growing across restarts too.
		zone:   newTable(uint32(time.Now().Unix())),
		synced: make(chan struct{}),
	}
	if cfg.ClientRate <= 0 {
		cfg.ClientRate = DefaultClientRate
	}
	if cfg.ClientBurst <= 0 {
		cfg.ClientBurst = DefaultClientBurst
	}
	s.cfg = cfg
	s.perClient = sourcerate.New(cfg.ClientRate, cfg.ClientBurst, clients)
	s.queries, s.truncated, s.limited = newQueriesMetric(), newTruncatedMetric(), newLimitedMetric()
	if err := ctrl.Register(cfg.Metrics, s.queries, s.truncated, s.limited); err != nil {
		return nil, fmt.Errorf("clusterset DNS: metrics: %w", err)
	}
	var err error
	s.loop, err = ctrl.New(ctrl.Config[string]{
		Name: "clusterset_dns", Workers: 2, Metrics: cfg.Metrics,
		// client-go's default, as before the loop moved to ctrl.
		RateLimiter: workqueue.DefaultTypedControllerRateLimiter[string](),
		Reconcile: ctrl.WithoutDelay(func(ctx context.Context, key string) error {
			return s.rebuild(ctx, s.imported, key)
		}),
		Errors: &ctrl.ErrorLog[string]{Logger: s.log, Failed: "rebuild records", Attrs: ctrl.Named[string]("service")},
	})
	if err != nil {
		return nil, fmt.Errorf("clusterset DNS: %w", err)
	}
	if s.tcp, s.udp, err = listen(cfg.Address); err != nil {
		return nil, fmt.Errorf("clusterset DNS: %w (choose another with --clusterset-dns-port, or 0 to disable)", err)
	}
	return s, nil
}

// listen binds TCP and UDP on the same port; with port 0, a free one for
// both.
func listen(addr netip.AddrPort) (net.Listener, net.PacketConn, error) {
	for attempt := 0; ; attempt++ {
		tcp, err := net.Listen("tcp", addr.String())
		if err != nil {
			return nil, nil, fmt.Errorf("listen on TCP %s: %w", addr, err)
		}
		port := tcp.Addr().(*net.TCPAddr).Port
		udp, err := net.ListenPacket("udp", net.JoinHostPort(addr.Addr().String(), strconv.Itoa(port)))
		if err == nil {
			return tcp, udp, nil
		}
		tcp.Close()
		if addr.Port() != 0 || attempt == 10 {
			return nil, nil, fmt.Errorf("listen on UDP %s: %w", addr, err)
		}
	}
}

// Addr is where the server listens, UDP and TCP.
func (s *Server) Addr() netip.AddrPort {
	return s.tcp.Addr().(*net.TCPAddr).AddrPort()
}

// Run watches the ServiceImports and EndpointSlices and answers queries
// until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	servers := []*dns.Server{
		{PacketConn: s.udp, Handler: s, UDPSize: dns.DefaultMsgSize},
		// CoreDNS's forward keeps its connections: no cap on queries per
		// connection (the library's default closes one after 128); the
		// idle timeout still ends the quiet ones.
		{Listener: s.tcp, Handler: s, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxTCPQueries: -1},
	}
	errc := make(chan error, len(servers)+1)
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() { errc <- srv.ActivateAndServe() })
		select {
		case <-started:
		case err := <-errc:
			return fmt.Errorf("clusterset DNS: serve: %w", err)
		}
	}
	defer func() {
		for _, srv := range servers {
			if err := srv.Shutdown(); err != nil {
				s.log.Warn("stop serving", "err", err)
			}
		}
	}()
	s.log.Info("answering the clusterset zone", "address", s.Addr().String())
	wg.Go(func() { errc <- s.watch(ctx) })
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped on its own")
		}
		return fmt.Errorf("clusterset DNS: %w", err)
	}
}

// ServeDNS answers one query (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if ok, udp := s.allow(w); !ok {
		if !udp {
			refused := new(dns.Msg)
			refused.SetRcode(req, dns.RcodeRefused)
			_ = w.WriteMsg(refused)
		}
		return
	}
	resp := s.respond(req)
	qtype := "none"
	if len(req.Question) == 1 {
		qtype = typeLabel(req.Question[0].Qtype)
	}
	s.queries.WithLabelValues(qtype, dns.RcodeToString[resp.Rcode]).Inc()
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		resp.Truncate(udpAnswerSize(req))
		if resp.Truncated {
			s.truncated.Inc()
		}
	}
	if err := w.WriteMsg(resp); err != nil {
		s.log.Debug("write answer", "client", w.RemoteAddr().String(), "err", err)
	}
}

// allow takes the query from its client's bucket. Past it, a UDP query
// is dropped and a TCP one (whose client is who it says) answered
// REFUSED; either is counted, and logged once a minute.
func (s *Server) allow(w dns.ResponseWriter) (ok, udp bool) {
	_, udp = w.RemoteAddr().(*net.UDPAddr)
	ap, err := netip.ParseAddrPort(w.RemoteAddr().String())
	// No limiter: a Server made without New (tests of answers).
	if err != nil || s.perClient == nil || s.perClient.Allow(ap.Addr()) {
		return true, udp
	}
	transport := "tcp"
	if udp {
		transport = "udp"
	}
	s.limited.WithLabelValues(transport).Inc()
	now := time.Now().UnixNano()
	if last := s.limitLogged.Load(); now-last >= int64(time.Minute) && s.limitLogged.CompareAndSwap(last, now) {
		s.log.Warn("clusterset DNS: a client asks more than its rate; its queries are dropped (UDP) or refused (TCP) "+
			"(logged once a minute; flotilla_clusterset_dns_limited_total counts them all)",
			"client", ap.Addr(), "rate", s.cfg.ClientRate, "burst", s.cfg.ClientBurst)
	}
	return false, udp
}

// respond builds the answer to req.
func (s *Server) respond(req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	switch {
	case req.Opcode != dns.OpcodeQuery:
		resp.SetRcode(req, dns.RcodeNotImplemented)
	case len(req.Question) != 1:
		resp.SetRcode(req, dns.RcodeFormatError)
	case req.Question[0].Qclass != dns.ClassINET && req.Question[0].Qclass != dns.ClassANY:
		resp.SetRcode(req, dns.RcodeRefused)
	default:
		resp.SetReply(req)
		select {
		case <-s.synced:
			s.zone.answer(req, resp)
		default:
			resp.Rcode = dns.RcodeServerFailure
		}
	}
	// The server recurses nowhere, but its answers for the zone are final,
	// what a recursive resolver would answer: a client that asks for
	// recursion gets RA on them. CoreDNS forwards the answer as it is, and
	// without RA a pod's dig or nslookup warns "recursion not available".
	// Names out of the zone are refused, without RA.
	resp.RecursionAvailable = req.RecursionDesired && resp.Authoritative
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(maxUDPAnswer, false)
	}
	return resp
}

// udpAnswerSize is the most bytes an answer to req may take over UDP:
// the client's EDNS0 size (512 without EDNS0), at most maxUDPAnswer.
func udpAnswerSize(req *dns.Msg) int {
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
	}
	return min(size, maxUDPAnswer)
}

func newQueriesMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flotilla_clusterset_dns_queries_total",
		Help: "Queries the clusterset.local DNS server answered, by query type (A, AAAA, SRV, TXT, SOA, NS, PTR, ANY, other) and response code.",
	}, []string{"type", "rcode"})
}

func newLimitedMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flotilla_clusterset_dns_limited_total",
		Help: "Queries past their client address's rate: dropped over UDP, answered REFUSED over TCP, by transport (udp, tcp).",
	}, []string{"transport"})
}

func newTruncatedMetric() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flotilla_clusterset_dns_truncated_total",
		Help: "UDP answers truncated (TC set) to the client's EDNS0 size, at most 1232 bytes; the client asks again over TCP.",
	})
}

// typeLabel bounds the metric's type label to the types the zone has.
func typeLabel(t uint16) string {
	switch t {
	case dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeSOA, dns.TypeANY, dns.TypePTR, dns.TypeNS:
		return dns.TypeToString[t]
	}
	return "other"
}
