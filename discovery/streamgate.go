package discovery

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// StreamLimits bound the gossip streams (TCP) other hosts open to this
// agent. They apply when a connection is accepted, before memberlist
// reads a byte of it or tries to decrypt it: a host without the
// federation key can open connections, and each would otherwise cost a
// goroutine and up to memberlist's own limit of 20 MB of buffered bytes.
type StreamLimits struct {
	// Concurrent is the most streams open at once, from every source;
	// default 32.
	Concurrent int
	// PerSource is the most streams open at once from one IP address;
	// default 16, half of Concurrent. Members behind one NAT share it.
	PerSource int
	// SourceRate and SourceBurst bound the streams one IP address may
	// open, per second and at once; defaults 50/s and 200 (a hundred
	// members behind one address joining at once).
	SourceRate  float64
	SourceBurst int
	// ReadCap is the most bytes read from one stream; default 1 MiB,
	// a push/pull of about 2000 members. A longer stream is cut.
	ReadCap int64
	// Lifetime is the longest a stream stays open; default 10 s, the
	// LAN profile's TCPTimeout.
	Lifetime time.Duration
}

// Defaults of StreamLimits: together, a flood of connections holds at
// most 32 MiB of stream bytes in the agent, whoever sends them.
const (
	defaultStreamsConcurrent = 32
	defaultStreamsPerSource  = 16
	defaultSourceRate        = 50
	defaultSourceBurst       = 200
	defaultStreamReadCap     = 1 << 20
	defaultStreamLifetime    = 10 * time.Second
)

func (l StreamLimits) withDefaults() StreamLimits {
	if l.Concurrent <= 0 {
		l.Concurrent = defaultStreamsConcurrent
	}
	if l.PerSource <= 0 {
		l.PerSource = defaultStreamsPerSource
	}
	if l.SourceRate <= 0 {
		l.SourceRate = defaultSourceRate
	}
	if l.SourceBurst <= 0 {
		l.SourceBurst = defaultSourceBurst
	}
	if l.ReadCap <= 0 {
		l.ReadCap = defaultStreamReadCap
	}
	if l.Lifetime <= 0 {
		l.Lifetime = defaultStreamLifetime
	}
	return l
}

// Reasons a stream is refused or cut; they label
// flotilla_discovery_gossip_streams_limited_total.
const (
	StreamBusy       = "busy"        // Concurrent reached
	StreamSourceBusy = "source_busy" // PerSource reached
	StreamSourceRate = "source_rate" // the source's rate exceeded
	StreamOversized  = "oversized"   // ReadCap reached: the stream is cut
)

// maxSources bounds the per-source table; idle sources are forgotten
// when it is full.
const maxSources = 4096

// errStreamOversized is what memberlist reads from a stream past its cap.
var errStreamOversized = errors.New("gossip stream longer than its read cap")

// streamGate admits accepted connections under StreamLimits.
type streamGate struct {
	limits  StreamLimits
	limited func(reason string) // counts a refusal or a cut
	log     *slog.Logger

	mu      sync.Mutex
	open    int
	sources map[netip.Addr]*sourceState
	logged  map[string]time.Time // reason: last logged
}

type sourceState struct {
	open    int
	limiter *rate.Limiter
}

func newStreamGate(l StreamLimits, limited func(string), log *slog.Logger) *streamGate {
	if limited == nil {
		limited = func(string) {}
	}
	return &streamGate{limits: l.withDefaults(), limited: limited, log: log,
		sources: map[netip.Addr]*sourceState{}, logged: map[string]time.Time{}}
}

// admit returns c wrapped in its bounds, or closes it and returns nil.
func (g *streamGate) admit(c *net.TCPConn) net.Conn {
	from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if reason := g.take(from); reason != "" {
		// Counted before the reset, so that a refused host that sees it
		// finds it counted.
		g.refused(reason, from)
		_ = c.SetLinger(0) // a reset: no TIME_WAIT kept for a refused host
		_ = c.Close()
		return nil
	}
	_ = c.SetDeadline(time.Now().Add(g.limits.Lifetime))
	return &gatedConn{Conn: c, gate: g, from: from, left: g.limits.ReadCap}
}

// take reserves a stream for from, or says why not.
func (g *streamGate) take(from netip.Addr) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.sources[from]
	if s == nil {
		if len(g.sources) >= maxSources {
			g.forgetIdle()
		}
		s = &sourceState{limiter: rate.NewLimiter(rate.Limit(g.limits.SourceRate), g.limits.SourceBurst)}
		g.sources[from] = s
	}
	switch {
	case !s.limiter.Allow():
		return StreamSourceRate
	case s.open >= g.limits.PerSource:
		return StreamSourceBusy
	case g.open >= g.limits.Concurrent:
		return StreamBusy
	}
	s.open++
	g.open++
	return ""
}

// forgetIdle drops the sources without an open stream. A forgotten
// source starts again with a full burst: the concurrency bounds, not
// the rates, are what hold memory.
func (g *streamGate) forgetIdle() {
	for a, s := range g.sources {
		if s.open == 0 {
			delete(g.sources, a)
		}
	}
}

func (g *streamGate) release(from netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open--
	if s := g.sources[from]; s != nil {
		s.open--
	}
}

// refused counts a refusal and logs it at most once a minute per reason.
func (g *streamGate) refused(reason string, from netip.Addr) {
	g.limited(reason)
	now := time.Now()
	g.mu.Lock()
	last, seen := g.logged[reason]
	quiet := seen && now.Sub(last) < time.Minute
	if !quiet {
		g.logged[reason] = now
	}
	g.mu.Unlock()
	if !quiet {
		g.log.Warn("gossip stream refused (logged once a minute per reason; flotilla_discovery_gossip_streams_limited_total counts them all)",
			"from", from, "reason", reason, "limits", fmt.Sprintf("%+v", g.limits))
	}
}

// gatedConn is an admitted stream: reads stop at the cap, and closing it
// frees its place. It holds a net.Conn, not the *net.TCPConn, so that no
// WriteTo or splice reads past the cap.
type gatedConn struct {
	net.Conn
	gate  *streamGate
	from  netip.Addr
	left  int64
	close sync.Once
}

func (c *gatedConn) Read(b []byte) (int, error) {
	if c.left <= 0 {
		c.gate.refused(StreamOversized, c.from)
		_ = c.Conn.Close()
		return 0, errStreamOversized
	}
	if int64(len(b)) > c.left {
		b = b[:c.left]
	}
	n, err := c.Conn.Read(b)
	c.left -= int64(n)
	return n, err
}

func (c *gatedConn) Close() error {
	err := c.Conn.Close()
	c.close.Do(func() { c.gate.release(c.from) })
	return err
}
