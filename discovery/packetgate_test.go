package discovery

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// A flood of packets from one address over real sockets: memberlist gets
// no more than the source's burst and rate of it, the drops are counted,
// and a packet from another address sent after the flood still reaches
// memberlist, which reads them in the order they came.
func TestGossipPacketFloodFromOneSourceIsLimited(t *testing.T) {
	var dropped atomic.Int64
	limits := PacketLimits{SourceRate: 50, SourceBurst: 100}
	tr, err := newTransport(netip.MustParseAddrPort("127.0.0.1:0"), slog.New(slog.DiscardHandler),
		gates{packets: newPacketGate(limits, func() { dropped.Add(1) }, slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown() })
	to := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port()))
	send := func(from string, n int) {
		t.Helper()
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(from+":0")), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range n {
			if _, err := c.Write(fmt.Appendf(nil, "x%s %d", from, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	start := time.Now()
	const flood = 2000
	send("127.0.0.2", flood)
	send("127.0.0.3", 1)
	fromFlood := 0
	for {
		select {
		case p := <-tr.PacketCh():
			if p.From.(*net.UDPAddr).IP.Equal(net.ParseIP("127.0.0.3")) {
				elapsed := time.Since(start)
				// The kernel may drop some of the flood too (its buffer):
				// what passed is bounded by the gate either way.
				most := limits.SourceBurst + int(limits.SourceRate*elapsed.Seconds()) + 1
				if fromFlood > most {
					t.Errorf("%d of %d flood packets reached memberlist in %s, want at most %d", fromFlood, flood, elapsed, most)
				}
				if fromFlood == 0 || dropped.Load() == 0 {
					t.Errorf("%d flood packets passed, %d dropped: want some of each", fromFlood, dropped.Load())
				}
				t.Logf("flood of %d: %d reached memberlist, %d dropped by the gate; the other source's packet after it in %s", flood, fromFlood, dropped.Load(), elapsed)
				return
			}
			fromFlood++
		case <-time.After(10 * time.Second):
			t.Fatalf("the other source's packet never reached memberlist (%d of the flood did, %d dropped)", fromFlood, dropped.Load())
		}
	}
}
