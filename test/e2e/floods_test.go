package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// floodHeapLimit is the live heap an agent may hold while it is
// flooded: its memory request in deploy/deployment.yaml (the limit is
// twice that). Unbounded, the flood below makes memberlist buffer up to
// 2 MiB for each of 50 streams at once, on top of the agent's own heap.
// The heap in use is reported, not bounded: it includes the garbage
// the collector lets grow (GOGC), which what the gate holds back does
// not set.
const floodHeapLimit = 64 << 20

// A host on the LAN without the federation key opens 1000 gossip streams
// to agent a, each claiming 16 MiB of sealed state and sending 2 MiB:
// every one is refused or cut before memberlist decrypts it, a's live
// heap stays under floodHeapLimit throughout, and a and b stay
// Connected, b alive in a's gossip.
func TestGossipFloodFromTheLANIsBounded(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3[:2], LAN: lan})
	federation.Connect(t, cs)
	a := cs[0]
	stranger := env.NewSite("x", harness.SiteOptions{LAN: lan})

	const streams, sent, workers = 1000, 2 << 20, 50
	limited := func() (float64, error) {
		return agentMetric(a.Site, "flotilla_discovery_gossip_streams_limited_total")
	}
	before, err := limited()
	if err != nil {
		t.Fatal(err)
	}
	sample := func(metric string) *harness.Peak {
		return harness.SamplePeak(100*time.Millisecond, func() (uint64, error) {
			v, err := agentMetric(a.Site, metric)
			return uint64(v), err
		})
	}
	peakLive, peakInUse := sample("go_gc_heap_live_bytes"), sample("go_memstats_heap_inuse_bytes")

	target := netip.AddrPortFrom(a.Site.Addr, 7946).String()
	var dialed atomic.Int64
	harness.Flood(streams, workers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := stranger.DialContext(ctx, "tcp", target)
		cancel()
		if errors.Is(err, syscall.ECONNRESET) {
			dialed.Add(1) // accepted, and reset by the gate before the dial returned
		}
		if err != nil {
			return
		}
		dialed.Add(1)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		harness.WriteSealedStateClaim(c, 16<<20, sent)
		_ = c.Close()
	})
	t.Logf("%d of %d streams reached the agent", dialed.Load(), streams)

	waitFor(t, a.Agent, 60*time.Second, func() error {
		now, err := limited()
		if err != nil {
			return err
		}
		if now-before < float64(dialed.Load()) {
			return fmt.Errorf("%v of the %d flood streams refused or cut", now-before, dialed.Load())
		}
		return nil
	})
	peakHeap, inUse := peakLive.Stop(), peakInUse.Stop()
	for _, r := range []string{"busy", "source_busy", "source_rate", "oversized"} {
		v, _ := agentMetric(a.Site, "flotilla_discovery_gossip_streams_limited_total", "reason="+r)
		t.Logf("refused or cut, %s: %v", r, v)
	}
	if dialed.Load() != streams {
		t.Errorf("%d of %d flood streams reached the agent", dialed.Load(), streams)
	}
	if now, _ := limited(); now-before != streams {
		t.Errorf("%v streams refused or cut, want every one of the %d", now-before, streams)
	}
	t.Logf("a's live heap peaked at %.1f MiB during the flood (limit %d MiB), its heap in use at %.1f MiB",
		float64(peakHeap)/(1<<20), floodHeapLimit>>20, float64(inUse)/(1<<20))
	if peakHeap == 0 || peakHeap > floodHeapLimit {
		t.Errorf("a's live heap peaked at %d MiB during the flood, limit %d MiB", peakHeap>>20, floodHeapLimit>>20)
	}

	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 30*time.Second)
	waitFor(t, a.Agent, 30*time.Second, func() error {
		alive, err := agentMetric(a.Site, "flotilla_discovery_members", "state=alive")
		if err != nil {
			return err
		}
		if alive != 1 {
			return fmt.Errorf("a has %v alive members, want b", alive)
		}
		return nil
	})
}

// agentMetric is the sum of the series of metric name on the agent in
// site s whose labels include labels ("k=v").
func agentMetric(s *harness.Site, name string, labels ...string) (float64, error) {
	body, err := getIn(s, "http://127.0.0.1:9470/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
line:
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(line, k+`="`+v+`"`) {
				continue line
			}
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no %s %v on the agent's /metrics", name, labels)
	}
	return sum, nil
}

// A host on the LAN answers every mDNS browse of the agents from 150
// addresses of its own, each answer naming 10 instances of the
// federation (the fingerprint is public: it is in every advert) at four
// private addresses and a public one: agent a keeps at most 256
// candidates from mDNS, none of them public, counts each refusal, stays
// within floodHeapLimit and stays Connected with b.
func TestMDNSStormFromTheLANIsCapped(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3[:2], LAN: lan})
	federation.Connect(t, cs)
	a := cs[0]
	stranger := env.NewSite("x", harness.SiteOptions{LAN: lan})
	fp := federationFingerprint(t, a)

	// The stranger's addresses: the top of the LAN's /24, which the
	// harness hands to no member.
	const sources = 150
	link, err := stranger.Netlink().LinkByName(stranger.Underlay)
	if err != nil {
		t.Fatal(err)
	}
	var senders []*net.UDPConn
	for i := range sources {
		addr := stranger.Addr.As4()
		addr[3] = byte(100 + i)
		p := netip.PrefixFrom(netip.AddrFrom4(addr), 24)
		if err := stranger.Netlink().AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatalf("add %s to the stranger: %v", p, err)
		}
		var c *net.UDPConn
		if err := stranger.Do(func() (err error) {
			c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: p.Addr().AsSlice()})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		senders = append(senders, c)
	}
	var queries *net.UDPConn
	if err := stranger.Do(func() error {
		ifi, err := net.InterfaceByName(stranger.Underlay)
		if err != nil {
			return err
		}
		queries, err = net.ListenMulticastUDP("udp4", ifi, &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5353})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = queries.Close() })

	// Answer every browse (a PTR query for the service from a port other
	// than 5353) from every address.
	var answered atomic.Int64
	storm := make(chan struct{})
	var stormer sync.WaitGroup
	stormer.Go(func() {
		buf := make([]byte, 9000)
		for {
			select {
			case <-storm:
				return
			default:
			}
			_ = queries.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, from, err := queries.ReadFromUDPAddrPort(buf)
			if err != nil {
				continue
			}
			var q dns.Msg
			if q.Unpack(buf[:n]) != nil || q.Response || from.Port() == 5353 || len(q.Question) != 1 || q.Question[0].Qtype != dns.TypePTR {
				continue
			}
			for i, c := range senders {
				if _, err := c.WriteToUDPAddrPort(stormAnswer(t, fp, i), from); err == nil {
					answered.Add(1)
				}
			}
		}
	})
	defer func() {
		close(storm)
		stormer.Wait()
	}()

	var peak atomic.Uint64
	dropped := func(reason string) float64 {
		v, _ := agentMetric(a.Site, "flotilla_discovery_candidates_dropped_total", "source=mdns", "reason="+reason)
		return v
	}
	// Witness: the cap is reached and each bound refused some (several
	// browses, 10 s apart).
	waitFor(t, a.Agent, 90*time.Second, func() error {
		if v, err := agentMetric(a.Site, "go_memstats_heap_inuse_bytes"); err == nil {
			peak.Store(max(peak.Load(), uint64(v)))
		}
		for _, r := range []string{"source_cap", "too_many", "candidates_full", "not_lan"} {
			if dropped(r) == 0 {
				return fmt.Errorf("no answer dropped for %s yet (%d answers sent)", r, answered.Load())
			}
		}
		return nil
	})
	for _, r := range []string{"source_cap", "too_many", "candidates_full", "not_lan"} {
		t.Logf("dropped, %s: %v", r, dropped(r))
	}
	candidates, err := agentMetric(a.Site, "flotilla_discovery_candidates", "source=mdns")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d spoofed answers sent; a has %v candidates from mDNS; its heap in use peaked at %.1f MiB", answered.Load(), candidates, float64(peak.Load())/(1<<20))
	if candidates > 256 {
		t.Errorf("%v candidates from mDNS, at most 256", candidates)
	}
	if peak.Load() > floodHeapLimit {
		t.Errorf("a's heap in use peaked at %d MiB, limit %d MiB", peak.Load()>>20, floodHeapLimit>>20)
	}
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 30*time.Second)
}

// stormAnswer is stranger i's answer: 10 instances of the federation,
// each at four private addresses of its own and a public one; the first
// stranger's at the public one only.
func stormAnswer(t *testing.T, fp string, i int) []byte {
	m := new(dns.Msg)
	m.Response, m.Authoritative = true, true
	hdr := func(name string, rrtype uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: 120}
	}
	service := discovery.ServiceName + ".local."
	for k := range 10 {
		inst := fmt.Sprintf("s%d-%d.%s", i, k, service)
		host := fmt.Sprintf("s%d-%d.local.", i, k)
		m.Answer = append(m.Answer, &dns.PTR{Hdr: hdr(service, dns.TypePTR), Ptr: inst})
		m.Extra = append(m.Extra,
			&dns.SRV{Hdr: hdr(inst, dns.TypeSRV), Port: 7946, Target: host},
			&dns.TXT{Hdr: hdr(inst, dns.TypeTXT), Txt: []string{"txtvers=1", "id=" + strings.Repeat("c", 27), "fp=" + fp, "v=3"}})
		for o := range 4 {
			if i > 0 {
				m.Extra = append(m.Extra, &dns.A{Hdr: hdr(host, dns.TypeA), A: net.IPv4(10, byte(200+o), byte(i), byte(k))})
			}
		}
		m.Extra = append(m.Extra, &dns.A{Hdr: hdr(host, dns.TypeA), A: net.IPv4(203, 0, 113, byte(i))})
	}
	b, err := m.Pack()
	if err != nil {
		t.Errorf("pack the storm's answer: %v", err)
	}
	return b
}

// federationFingerprint is the fingerprint of c's federation key, as its
// mDNS advert tells anyone on the LAN.
func federationFingerprint(t *testing.T, c *federation.Cluster) string {
	t.Helper()
	for i, arg := range c.Args {
		if arg == "--federation-key" && i+1 < len(c.Args) {
			tok, err := discovery.ParseJoinToken(c.Args[i+1])
			if err != nil {
				t.Fatal(err)
			}
			return discovery.Fingerprint(tok.Key)
		}
	}
	t.Fatal("no --federation-key in the agent's arguments")
	return ""
}
