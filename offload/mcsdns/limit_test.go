package mcsdns

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A flood of UDP queries from one client address gets no more answers
// than its burst and rate, the rest dropped and counted; another client
// is answered right after it; over TCP the flooding client is answered
// REFUSED past its rate. The server is a real one on real sockets; any
// answer counts (SERVFAIL too: no CRDs are installed).
func TestClientRateLimit(t *testing.T) {
	const rate, burst = 20, 40
	e := newDNSEnv(t, func(c *Config) { c.ClientRate, c.ClientBurst = rate, burst })
	server := net.UDPAddrFromAddrPort(e.srv.Addr())
	query := func(id uint16) []byte {
		m := new(dns.Msg)
		m.SetQuestion("web.shop.svc.clusterset.local.", dns.TypeA)
		m.Id = id
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The positive witness: a client of its own is answered.
	e.answers(t, "udp", "web.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeServerFailure)

	const flood = 1000
	c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.2:0")), server)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	for i := range flood {
		if _, err := c.Write(query(uint16(i))); err != nil {
			t.Fatal(err)
		}
	}
	answered := 0
	buf := make([]byte, 2048)
	for {
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break // no answer for half a second: the rest were dropped
		}
		answered++
	}
	elapsed := time.Since(start)
	dropped := testutil.ToFloat64(e.srv.limited.WithLabelValues("udp"))
	most := burst + int(rate*elapsed.Seconds()) + 1
	t.Logf("a flood of %d UDP queries from 127.0.0.2: %d answered in %s, %.0f dropped by the limit", flood, answered, elapsed, dropped)
	if answered == 0 || answered > most {
		t.Errorf("%d of %d flood queries answered in %s, want 1 to %d", answered, flood, elapsed, most)
	}
	if dropped == 0 {
		t.Errorf("no query counted in flotilla_clusterset_dns_limited_total{transport=udp}")
	}

	// Another client, right after: answered.
	other := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP("127.0.0.3")}}}
	req := new(dns.Msg)
	req.SetQuestion("web.shop.svc.clusterset.local.", dns.TypeA)
	if _, _, err := other.Exchange(req, e.srv.Addr().String()); err != nil {
		t.Errorf("another client after the flood: %v", err)
	}

	// Over TCP the client is who it says: past its rate it is told so.
	tcp := &dns.Client{Net: "tcp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}}
	conn, err := tcp.Dial(e.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	refused := 0
	for range 2 * burst {
		resp, _, err := tcp.ExchangeWithConn(req.Copy(), conn)
		if err != nil {
			t.Fatalf("over TCP: %v", err)
		}
		if resp.Rcode == dns.RcodeRefused {
			refused++
		}
	}
	if refused == 0 || testutil.ToFloat64(e.srv.limited.WithLabelValues("tcp")) != float64(refused) {
		t.Errorf("%d of %d TCP queries REFUSED, %v counted; want some, all counted", refused, 2*burst, testutil.ToFloat64(e.srv.limited.WithLabelValues("tcp")))
	}
}
