package discovery

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/hashicorp/memberlist"
)

// startGated is a transport whose streams pass a gate of limits; limited
// counts the gate's refusals and cuts by reason.
func startGated(t *testing.T, l StreamLimits) (*transport, *limitCounts) {
	t.Helper()
	counts := &limitCounts{by: map[string]int{}}
	tr, err := newTransport(netip.MustParseAddrPort("127.0.0.1:0"), slog.New(slog.DiscardHandler), gates{streams: newStreamGate(l, counts.add, slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown() })
	return tr, counts
}

type limitCounts struct {
	mu sync.Mutex
	by map[string]int
}

func (c *limitCounts) add(reason string) {
	c.mu.Lock()
	c.by[reason]++
	c.mu.Unlock()
}

func (c *limitCounts) get(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by[reason]
}

// dialFrom opens a stream to tr from the loopback address from.
func dialFrom(t *testing.T, tr *transport, from string) net.Conn {
	t.Helper()
	c, err := dial(t, tr, from)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	return c
}

func dial(t *testing.T, tr *transport, from string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port())))
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// accepted waits for the next stream the transport hands to memberlist.
func accepted(t *testing.T, tr *transport) net.Conn {
	t.Helper()
	select {
	case c := <-tr.StreamCh():
		t.Cleanup(func() { _ = c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no stream handed to memberlist")
		return nil
	}
}

// refused checks that the gate closed a stream from from without handing
// it on: the connection is reset, or a read sees its end.
func refused(t *testing.T, tr *transport, from string) {
	t.Helper()
	c, err := dial(t, tr, from)
	if err != nil {
		return // reset before the dial returned
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	_, err = c.Read(b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("stream not refused: read %v", err)
	}
}

// Each bound refuses the stream past it, before memberlist sees it, and
// leaves other sources their own share.
func TestStreamGateRefusesPastEachBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits StreamLimits
		// opened are the sources of the streams held open first, all
		// admitted; then a stream from next is refused for reason, and
		// one from other is still admitted (when set).
		opened      []string
		next        string
		reason      string
		other       string
		closeOpened bool
	}{
		{name: "per source", limits: StreamLimits{PerSource: 2},
			opened: []string{"127.0.0.2", "127.0.0.2"}, next: "127.0.0.2", reason: StreamSourceBusy, other: "127.0.0.3"},
		{name: "every source", limits: StreamLimits{Concurrent: 3},
			opened: []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}, next: "127.0.0.5", reason: StreamBusy},
		{name: "source rate", limits: StreamLimits{SourceRate: 0.001, SourceBurst: 2},
			opened: []string{"127.0.0.2", "127.0.0.2"}, next: "127.0.0.2", reason: StreamSourceRate, other: "127.0.0.3", closeOpened: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, counts := startGated(t, tc.limits)
			for _, from := range tc.opened {
				dialFrom(t, tr, from)
				s := accepted(t, tr) // the positive witness: admitted
				if tc.closeOpened {
					_ = s.Close()
				}
			}
			refused(t, tr, tc.next)
			if got := counts.get(tc.reason); got != 1 {
				t.Errorf("%s counted %d times, want 1", tc.reason, got)
			}
			select {
			case c := <-tr.StreamCh():
				t.Fatalf("refused stream from %s handed to memberlist", c.RemoteAddr())
			default:
			}
			if tc.other != "" {
				dialFrom(t, tr, tc.other)
				accepted(t, tr)
			}
		})
	}
}

// A stream is read up to its cap and no further; its place is free again
// once memberlist closes it.
func TestStreamGateCutsAStreamAtItsReadCap(t *testing.T) {
	const readCap = 64 << 10
	tr, counts := startGated(t, StreamLimits{ReadCap: readCap, Concurrent: 1})
	c := dialFrom(t, tr, "127.0.0.2")
	go func() { _, _ = c.Write(make([]byte, 4*readCap)) }()
	s := accepted(t, tr)
	n, err := io.Copy(io.Discard, s)
	if n != readCap || !errors.Is(err, errStreamOversized) {
		t.Fatalf("read %d bytes and %v, want %d and the cap's error", n, err, readCap)
	}
	if got := counts.get(StreamOversized); got != 1 {
		t.Errorf("oversized counted %d times, want 1", got)
	}
	_ = s.Close()
	dialFrom(t, tr, "127.0.0.2")
	accepted(t, tr)
}

// A thousand streams from a host without the federation key, each
// claiming 16 MiB of encrypted state and sending 2 MiB: every one is
// refused or cut, the agent's heap grows by less than floodHeapLimit,
// and its member stays alive and still gets messages through a stream.
func TestGossipFloodFromAStrangerIsBounded(t *testing.T) {
	const (
		streams = 1000
		sent    = 2 << 20
		// floodHeapLimit is half the agent's memory limit (128 MiB in
		// deploy/deployment.yaml): the gate's bound is 16 streams of
		// this source at 1 MiB each, buffered in memberlist's growing
		// buffers, and the heap may hold what is dead until the
		// collector runs.
		floodHeapLimit = 64 << 20
	)
	inA := newInbox()
	longStreams := func(c *memberlist.Config) { c.TCPTimeout = 10 * time.Second }
	a := startNode(t, nodeOpts{onMessage: inA.handler, tune: longStreams})
	b := startNode(t, nodeOpts{seeds: []string{a.addr()}, tune: longStreams})
	waitUntil(t, 20*time.Second, func() error { return sees(a, b) })
	waitUntil(t, 20*time.Second, func() error { return sees(b, a) })

	runtime.GC()
	base := heapBytes()
	peak := harness.SamplePeak(5*time.Millisecond, func() (uint64, error) { return heapBytes(), nil })

	target := a.addr()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: 5 * time.Second}
	harness.Flood(streams, 50, func() {
		c, err := d.Dial("tcp", target)
		if err != nil {
			return
		}
		harness.WriteSealedStateClaim(c, 16<<20, sent)
		_ = c.Close()
	})

	limited := func() float64 {
		return metricValue(t, a.reg, "flotilla_discovery_gossip_streams_limited_total")
	}
	waitUntil(t, 20*time.Second, func() error {
		if got := limited(); got < streams {
			return errors.New("not every flood stream refused or cut yet")
		}
		return nil
	})
	peakHeap := peak.Stop()
	for _, r := range []string{StreamBusy, StreamSourceBusy, StreamSourceRate, StreamOversized} {
		t.Logf("%s: %v", r, metricValue(t, a.reg, "flotilla_discovery_gossip_streams_limited_total", "reason="+r))
	}
	if got := limited(); got != streams {
		t.Errorf("%v streams refused or cut, want every one of the %d", got, streams)
	}
	grew := int64(peakHeap) - int64(base)
	t.Logf("heap in use grew by at most %.1f MiB during the flood", float64(grew)/(1<<20))
	if grew > floodHeapLimit {
		t.Errorf("heap in use grew by %d MiB during the flood, limit %d MiB", grew>>20, floodHeapLimit>>20)
	}

	// The member is alive, and its streams get through.
	if err := sees(a, b); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.d.Send(ctx, a.id.ClusterID(), []byte("still here")); err != nil {
		t.Fatalf("b to a after the flood: %v", err)
	}
	if got := inA.next(t, 5*time.Second); string(got) != "still here" {
		t.Errorf("a got %q", got)
	}
}

// heapBytes is the memory the heap's objects occupy, live or not yet
// collected.
func heapBytes() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}
