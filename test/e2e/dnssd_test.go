package e2e

import (
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Sites behind a router (no multicast), no seeds, mDNS off: the agents
// find each other through DNS-SD records (PTR browsing, SRV, A) served by a
// real DNS server, and connect.
func TestPeeringWithDNSSD(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	const domain = "federation.test."
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3[:2], Routed: true})
	// The zone: one instance per cluster, its SRV pointing at its gossip port.
	zone := map[string][]dns.RR{}
	add := func(rr string) {
		r, err := dns.NewRR(rr)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.ToLower(r.Header().Name)
		zone[name] = append(zone[name], r)
	}
	for _, c := range cs {
		inst := c.Name + "._flotilla._udp." + domain
		add("_flotilla._udp." + domain + " 30 IN PTR " + inst)
		add(inst + " 30 IN SRV 0 0 7946 gw-" + c.Name + "." + domain)
		add("gw-" + c.Name + "." + domain + " 30 IN A " + c.Site.Addr.String())
	}
	// The server lives in site a, reachable from b through the router.
	server := cs[0].Site
	var pc net.PacketConn
	if err := server.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", server.Addr.String()+":53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Authoritative = true
		for _, qq := range q.Question {
			for _, rr := range zone[strings.ToLower(qq.Name)] {
				if rr.Header().Rrtype == qq.Qtype {
					m.Answer = append(m.Answer, rr)
				}
			}
		}
		if len(m.Answer) == 0 {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })

	for _, c := range cs {
		c.Args = append(c.Args, "--mdns=false", "--dns-domain", strings.TrimSuffix(domain, "."), "--dns-server", server.Addr.String()+":53")
		c.StartAgent(t)
	}
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
	federation.AllPairsTalk(t, cs)
	// Each resolved the other from the zone (no seeds, no mDNS were
	// given, so that is the only way they could have met).
	for i, c := range cs {
		other := cs[1-i]
		found := regexp.MustCompile(`msg="DNS-SD candidate" .*addr=` + regexp.QuoteMeta(other.Site.Addr.String()) + `:7946 `)
		if !found.MatchString(c.Agent.Log()) {
			t.Errorf("agent %s did not find %s (%s) through DNS-SD", c.Name, other.Name, other.Site.Addr)
		}
	}
}
