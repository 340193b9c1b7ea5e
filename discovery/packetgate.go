package discovery

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/internal/sourcerate"
)

// PacketLimits bound the gossip packets (UDP) one source address may send
// this agent. They apply as a packet is read, before memberlist looks at
// it or tries to decrypt it: a host without the federation key can send
// packets, and each would otherwise cost a copy and a decryption. A
// packet past its source's bucket is dropped, as a lost packet is; a
// member repeats what mattered.
type PacketLimits struct {
	// SourceRate and SourceBurst bound the packets from one IP address,
	// per second and at once; defaults 1000/s and 2000. A member sends a
	// few dozen a second (probes, acks, gossip to three members every
	// 200 ms, relayed probes of a suspect); members behind one NAT
	// share the bucket.
	SourceRate  float64
	SourceBurst int
}

// Defaults of PacketLimits.
const (
	DefaultPacketRate  = 1000
	DefaultPacketBurst = 2000
)

func (l PacketLimits) withDefaults() PacketLimits {
	if l.SourceRate <= 0 {
		l.SourceRate = DefaultPacketRate
	}
	if l.SourceBurst <= 0 {
		l.SourceBurst = DefaultPacketBurst
	}
	return l
}

// packetGate drops the packets of a source past its rate.
type packetGate struct {
	limits  PacketLimits
	sources *sourcerate.Limiter
	limited func() // counts a dropped packet
	log     *slog.Logger

	mu     sync.Mutex
	logged time.Time // when a drop was last logged
}

func newPacketGate(l PacketLimits, limited func(), log *slog.Logger) *packetGate {
	if limited == nil {
		limited = func() {}
	}
	l = l.withDefaults()
	return &packetGate{limits: l, sources: sourcerate.New(l.SourceRate, l.SourceBurst, maxSources), limited: limited, log: log}
}

// allow takes a packet of from's from its bucket, or counts it dropped.
func (g *packetGate) allow(from netip.Addr) bool {
	if g.sources.Allow(from) {
		return true
	}
	g.limited()
	now := time.Now()
	g.mu.Lock()
	quiet := now.Sub(g.logged) < time.Minute
	if !quiet {
		g.logged = now
	}
	g.mu.Unlock()
	if !quiet {
		g.log.Warn("gossip packets dropped: a source sends more than its rate (logged once a minute; flotilla_discovery_gossip_packets_limited_total counts them all)",
			"from", from, "rate", g.limits.SourceRate, "burst", g.limits.SourceBurst)
	}
	return false
}
