package ha

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
)

// Heartbeat timings: the active replica pings every HeartbeatInterval; a
// standby takes the Lease early once it has heard no ping for
// HeartbeatSilence and seen no renewal for HeartbeatUnrenewed. The
// latter is longer than the time between two renewals (a retry period
// and the write's own time), so a lost heartbeat alone never moves the
// Lease.
const (
	DefaultHeartbeatInterval  = 100 * time.Millisecond
	DefaultHeartbeatSilence   = time.Second
	DefaultHeartbeatUnrenewed = 1500 * time.Millisecond
)

// takeWindow is how long after the silence a standby may still take
// early: past it, a standby that has not heard the active replica since
// goes back to the lease duration, and the active replica, which stopped
// counting its pings to it, stops fencing itself early for its sake (a
// dead standby does not shorten the active one's patience with the API
// server for long).
const takeWindow = 2 * time.Second

// DefaultHeartbeatPort is the UDP port replicas ping each other on.
const DefaultHeartbeatPort = 7947

// Heartbeat is the replicas' own sign of life, beside the Lease: a
// standby learns that the active replica died in about a second, where
// the Lease alone tells it after a lease duration.
//
// The active replica pings every other replica every Interval; a standby
// answers the pings of the replica the Lease names. Once a ping has
// acknowledged one of its answers (the path works both ways, and the
// active replica knows it), the standby takes the Lease early, by the
// same conditional write as an expired one, when it has heard no ping for
// Silence and seen no renewal of the Lease for Unrenewed.
//
// The active replica knows when each standby could do so: not before
// Silence after the newest of its pings the standby answered, and not
// before Unrenewed after its own last renewal the API server accepted
// (the standby saw that renewal no earlier than it was sent). It is fenced
// before the earliest such instant (hold.fenceAt), as before a lease
// duration without renewal. A standby that never had an answer
// acknowledged cannot take early: its only rule is the lease duration.
//
// Pings count, or only probe: the active replica marks a ping to a
// standby as counting while that standby answered within Silence (or
// never answered yet). A standby's silence runs from the last counting
// ping it heard, and it takes early only within takeWindow after the
// silence; so once a standby has not answered for Silence, the active
// replica knows when that standby's window ends at the latest, and past
// it that standby no longer shortens the active one's fence.
type Heartbeat struct {
	// Conn is this replica's socket; Peers lists where the other replicas
	// listen.
	Conn  net.PacketConn
	Peers func() []netip.AddrPort
	// Timings; zero means the defaults above.
	Interval, Silence, Unrenewed time.Duration

	me  string
	log *slog.Logger

	mu sync.Mutex
	// The active side: this run's nonce, the last ping's number, when
	// each recent one was sent, and what it knows of each standby.
	nonce    uint64
	seq      uint64
	sent     map[uint64]time.Time
	standbys map[netip.AddrPort]*standby
	// The standby side: the Lease as last seen and when it last changed,
	// and what this replica heard from its holder.
	lease   *coordinationv1.Lease
	holder  string
	changed time.Time
	heard   heard
	// lastHeard is when a ping this replica answered, or an answer to
	// one of its pings, last came (the metric); zero: none yet.
	lastHeard time.Time
}

// standby is what the active replica knows of one standby.
type standby struct {
	// answered is the newest counting ping it answered, answeredPing
	// when that ping was sent; zero: none.
	answered     uint64
	answeredPing time.Time
	// heard is when its last answer came; counted, when the last
	// counting ping was sent to it.
	heard, counted time.Time
}

// heard is what a standby heard from one run of the holder.
type heard struct {
	nonce uint64
	// first is the first counting ping it answered in that run; acked: a
	// counting ping acknowledged one of its answers since; lastPing is
	// when the last counting ping came.
	first    uint64
	acked    bool
	lastPing time.Time
}

// sentKept is how many recent pings' send times the active replica
// keeps: answers to older ones are not counted.
const sentKept = 64

func (h *Heartbeat) timings() (interval, silence, unrenewed time.Duration) {
	return orDefault(h.Interval, DefaultHeartbeatInterval), orDefault(h.Silence, DefaultHeartbeatSilence), orDefault(h.Unrenewed, DefaultHeartbeatUnrenewed)
}

// run pings while active says so, answers and watches for silence
// otherwise, until ctx ends; it sends on expired the Lease a standby may
// take early. The socket is closed when it returns.
func (h *Heartbeat) run(ctx context.Context, active func() bool, expired chan<- expiry) {
	interval, silence, unrenewed := h.timings()
	var b [8]byte
	rand.Read(b[:])
	h.mu.Lock()
	h.nonce, h.sent, h.standbys = binary.BigEndian.Uint64(b[:]), map[uint64]time.Time{}, map[netip.AddrPort]*standby{}
	h.mu.Unlock()
	go func() {
		<-ctx.Done()
		h.Conn.Close()
	}()
	go h.receive(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	var (
		offered string // the resourceVersion of the Lease last sent on expired
		// led: this replica has been active; it is not a standby again
		// before Elector.Run returns (fenced, it only waits to be
		// active again or to learn that another replica is).
		led bool
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if active() {
			led = true
			h.ping()
			continue
		}
		if led {
			continue
		}
		l := h.silent(time.Now(), silence, unrenewed)
		if l == nil || l.ResourceVersion == offered {
			continue
		}
		offered = l.ResourceVersion
		select {
		case expired <- expiry{lease: l, why: "the active replica went silent and the Lease was not renewed: took it"}:
		case <-ctx.Done():
			return
		}
	}
}

// ping sends the next ping to every other replica, each acknowledging
// the newest answer it gave, counting for those that answered within
// Silence or never did.
func (h *Heartbeat) ping() {
	_, silence, _ := h.timings()
	h.mu.Lock()
	h.seq++
	now := time.Now()
	h.sent[h.seq] = now
	delete(h.sent, h.seq-sentKept)
	peers := h.Peers()
	msgs := make([]beat, len(peers))
	for i, p := range peers {
		st := h.standbys[p]
		if st == nil {
			st = &standby{}
			h.standbys[p] = st
		}
		msgs[i] = beat{kind: beatPing, nonce: h.nonce, seq: h.seq, ack: st.answered, from: h.me}
		if st.answered == 0 || now.Sub(st.heard) < silence {
			msgs[i].counts = true
			st.counted = now
		}
	}
	// A replica gone from the list is forgotten: a new one at its
	// address starts from no answer.
	for p := range h.standbys {
		if !containsAddr(peers, p) {
			delete(h.standbys, p)
		}
	}
	h.mu.Unlock()
	for i, p := range peers {
		if _, err := h.Conn.WriteTo(msgs[i].encode(), net.UDPAddrFromAddrPort(p)); err != nil {
			h.log.Debug("heartbeat not sent", "to", p, "err", err)
		}
	}
}

func containsAddr(list []netip.AddrPort, a netip.AddrPort) bool {
	for _, b := range list {
		if b == a {
			return true
		}
	}
	return false
}

// receive reads pings and answers until the socket is closed.
func (h *Heartbeat) receive(ctx context.Context) {
	buf := make([]byte, maxBeat)
	for {
		n, from, err := h.Conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				h.log.Warn("heartbeat socket failed: no early takeover until restart", "err", err)
			}
			return
		}
		udp, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		src := udp.AddrPort()
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		m, err := decodeBeat(buf[:n])
		if err != nil {
			h.log.Debug("heartbeat refused", "from", src, "err", err)
			continue
		}
		switch m.kind {
		case beatPing:
			if reply, ok := h.pinged(m, time.Now()); ok {
				if _, err := h.Conn.WriteTo(reply.encode(), udp); err != nil {
					h.log.Debug("heartbeat answer not sent", "to", src, "err", err)
				}
			}
		case beatAnswer:
			h.answeredBy(src, m)
		}
	}
}

// pinged records a ping heard at now, and returns the answer to send: a
// standby answers the Lease's holder only.
func (h *Heartbeat) pinged(m beat, now time.Time) (beat, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holder == "" || m.from != h.holder || h.holder == h.me {
		return beat{}, false
	}
	h.lastHeard = now
	if h.heard.nonce != m.nonce {
		h.heard = heard{nonce: m.nonce}
	}
	if m.counts {
		if h.heard.first == 0 {
			h.heard.first = m.seq
		}
		if m.ack >= h.heard.first {
			h.heard.acked = true
		}
		h.heard.lastPing = now
	}
	return beat{kind: beatAnswer, nonce: m.nonce, seq: m.seq, counts: m.counts, from: h.me}, true
}

// answeredBy records a standby's answer to one of this run's pings.
func (h *Heartbeat) answeredBy(src netip.AddrPort, m beat) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.sent[m.seq]
	st := h.standbys[src]
	if !ok || m.nonce != h.nonce || st == nil {
		return
	}
	now := time.Now()
	st.heard, h.lastHeard = now, now
	// Only a counting ping tells when the standby's silence began.
	if m.counts && m.seq > st.answered {
		st.answered, st.answeredPing = m.seq, at
	}
}

// collector is the heartbeat's metric: how long since another replica
// was last heard.
func (h *Heartbeat) collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_heartbeat_heard_seconds",
		Help: "Seconds since this replica of the agent last heard another over the heartbeat (a standby: a ping of the active replica; the active: a standby's answer); -1 before the first. A standby takes over early only while it hears the active one (docs/ha.md).",
	}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.lastHeard.IsZero() {
			return -1
		}
		return time.Since(h.lastHeard).Seconds()
	})
}

// leaseSeen tells a standby's heartbeat the Lease as its watch delivers
// each change.
func (h *Heartbeat) leaseSeen(l *coordinationv1.Lease, now time.Time) {
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if holder != h.holder {
		h.heard = heard{}
	}
	h.lease, h.holder, h.changed = l, holder, now
}

// silent returns the Lease a standby may take at now: its holder is
// another replica whose path to this one worked both ways, and that has
// neither sent a counting ping for silence (less than takeWindow more)
// nor renewed for unrenewed.
func (h *Heartbeat) silent(now time.Time, silence, unrenewed time.Duration) *coordinationv1.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	quiet := now.Sub(h.heard.lastPing)
	switch {
	case h.lease == nil || h.holder == "" || h.holder == h.me || !h.heard.acked:
		return nil
	case quiet < silence || quiet >= silence+takeWindow || now.Sub(h.changed) < unrenewed:
		return nil
	}
	return h.lease
}

// earliestTake is the earliest instant a standby could take the Lease
// early, as known at now, for an active replica whose last accepted
// renewal was sent at renewed; zero if none could. A standby that
// answered a counting ping counts until its window could have ended:
// takeWindow after the silence that follows the last counting ping sent
// to it, and a silence more for that ping's way there.
func (h *Heartbeat) earliestTake(renewed, now time.Time) time.Time {
	_, silence, unrenewed := h.timings()
	h.mu.Lock()
	defer h.mu.Unlock()
	var earliest time.Time
	for _, st := range h.standbys {
		if st.answered == 0 || !now.Before(st.counted.Add(2*silence+takeWindow)) {
			continue
		}
		at := st.answeredPing.Add(silence)
		if r := renewed.Add(unrenewed); r.After(at) {
			at = r
		}
		if earliest.IsZero() || at.Before(earliest) {
			earliest = at
		}
	}
	return earliest
}

// A beat is a ping or an answer:
//
//	"FLHB" | version 1 | kind | flags | nonce (8) | seq (8) | ack (8) | length (2) | sender's identity
type beat struct {
	kind       byte
	nonce, seq uint64
	ack        uint64 // in a ping: the newest of the receiver's answers
	// counts: a counting ping, or the answer to one (flag 1).
	counts bool
	from   string
}

const (
	beatPing    byte = 1
	beatAnswer  byte = 2
	beatCounts  byte = 1
	beatHeader       = 4 + 1 + 1 + 1 + 8 + 8 + 8 + 2
	maxIdentity      = 512 // a node's name (253) and a suffix, and room
	maxBeat          = beatHeader + maxIdentity
)

func (m beat) encode() []byte {
	b := make([]byte, 0, beatHeader+len(m.from))
	b = append(b, "FLHB"...)
	var flags byte
	if m.counts {
		flags |= beatCounts
	}
	b = append(b, 1, m.kind, flags)
	b = binary.BigEndian.AppendUint64(b, m.nonce)
	b = binary.BigEndian.AppendUint64(b, m.seq)
	b = binary.BigEndian.AppendUint64(b, m.ack)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.from)))
	return append(b, m.from...)
}

// decodeBeat reads a beat another replica sent; anything else is an
// error.
func decodeBeat(b []byte) (beat, error) {
	switch {
	case len(b) < beatHeader:
		return beat{}, fmt.Errorf("%d bytes, shorter than a heartbeat's %d", len(b), beatHeader)
	case string(b[:4]) != "FLHB":
		return beat{}, errors.New("not a heartbeat")
	case b[4] != 1:
		return beat{}, fmt.Errorf("heartbeat version %d, want 1", b[4])
	case b[5] != beatPing && b[5] != beatAnswer:
		return beat{}, fmt.Errorf("heartbeat kind %d, want a ping (1) or an answer (2)", b[5])
	case b[6]&^beatCounts != 0:
		return beat{}, fmt.Errorf("heartbeat flags %#x, unknown", b[6])
	}
	m := beat{kind: b[5], counts: b[6]&beatCounts != 0,
		nonce: binary.BigEndian.Uint64(b[7:]), seq: binary.BigEndian.Uint64(b[15:]), ack: binary.BigEndian.Uint64(b[23:])}
	n := int(binary.BigEndian.Uint16(b[31:]))
	switch {
	case n > maxIdentity:
		return beat{}, fmt.Errorf("heartbeat sender's identity of %d bytes, more than %d", n, maxIdentity)
	case len(b) != beatHeader+n:
		return beat{}, fmt.Errorf("heartbeat of %d bytes, its identity says %d", len(b), beatHeader+n)
	case n == 0:
		return beat{}, errors.New("heartbeat without the sender's identity")
	case m.seq == 0:
		return beat{}, errors.New("heartbeat numbered 0")
	}
	m.from = string(b[beatHeader:])
	return m, nil
}

// expiry is a Lease a standby may take, and why, for its log.
type expiry struct {
	lease *coordinationv1.Lease
	why   string
}
