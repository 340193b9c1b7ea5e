package discovery

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Members behind NAT.
//
// A member whose gateway has only outbound connectivity (Config.OutboundOnly,
// carried in its signed record) advertises a gossip address nobody can
// reach: memberlist's probes, gossip and acks to it, and the streams of
// push/pull and peering messages, would all be lost, and it would be
// declared dead by every member it cannot answer. So it is reached only
// through what it opens itself, within memberlist's model:
//
//   - Packets. Before it sends a member its first packet, and again every
//     announceEvery while it keeps sending, it sends that member an
//     announcement: its advertised address, signed with the federation key.
//     The receiver notes the address the announcement came from (the NAT's
//     mapping of the member's gossip socket) and, for members whose record
//     says outbound only, sends what memberlist addresses to the advertised
//     address there instead. Probes, gossip and acks then go back through
//     the mapping the member keeps open by probing and gossiping itself.
//   - Streams. A member that wants a stream to it sends a dial-back request
//     (a nonce, signed) through the same mapping; the member dials the
//     requester's gossip port, writes the nonce, and serves the stream as
//     one it accepted. The requester hands that connection to memberlist
//     as the one it dialed.
//
// Members that can reach neither it nor another member that can relay a
// probe (memberlist's indirect probes) cannot keep it alive: two members
// both behind NAT with nobody reachable between them do not see each other.
//
// Wire form of a packet (none of memberlist's messages or encryption
// versions starts with natMagic):
//
//	0..2    natMagic
//	3       kind (natAnnounce, natDialBack)
//	4..11   time of sending, unix ns
//	        payload: announce: 1-byte length, "ip:port"; dial-back: nonce
//	        HMAC-SHA256(federation key, natDomain || all of the above)[:16]
//
// A dial-back stream starts with natMagic, natDialed and the nonce.
const (
	natAnnounce byte = 1
	natDialBack byte = 2
	natDialed   byte = 3

	natNonceLen  = 16
	natMACLen    = 16
	natHeaderLen = 3 + 1 + 8
	natDomain    = "flotilla/gossip-nat/v1\x00"

	// announceEvery: how often a member behind NAT announces itself to a
	// member it keeps sending to. A lost announcement costs that long.
	announceEvery = 2 * time.Second
	// natClockSkew bounds how far a signed packet's time may be from ours:
	// a replay older than that is refused. Members' clocks differ by far
	// less.
	natClockSkew = 5 * time.Minute
	// natForget: entries not refreshed for this long are dropped when the
	// tables are full.
	natForget = 5 * time.Minute
	// natTableMax bounds each table.
	natTableMax = 4096
	// maxDialBacks bounds the dial-backs in flight on a member behind NAT.
	maxDialBacks = 16
)

var natMagic = [3]byte{0xF0, 'F', 'N'}

// natStreamPreamble is the length of what a dial-back stream starts with.
const natStreamPreamble = 3 + 1 + natNonceLen

var errNATPacket = errors.New("not a valid NAT traversal packet")

// natTraversal is the state of both sides: the member behind NAT
// (outbound) and every member that talks to one.
type natTraversal struct {
	// outbound: this member is behind NAT.
	outbound bool
	// keys returns the federation keys, the primary first.
	keys func() [][]byte
	now  func() time.Time

	dialBacks chan struct{} // slots of dial-backs in flight

	mu sync.Mutex
	// advertise is this member's gossip address as members know it.
	advertise netip.AddrPort
	// sentTo: when this member (behind NAT) last announced itself to
	// each destination. A dial-back request is honoured only from one.
	sentTo map[netip.AddrPort]time.Time
	// behind: advertised gossip addresses of members whose record says
	// outbound only.
	behind map[netip.AddrPort]bool
	// seen: where each advertised address last announced itself from.
	seen map[netip.AddrPort]natMapping
	// pending: dial-backs this member waits for, by nonce.
	pending map[[natNonceLen]byte]chan<- net.Conn
}

type natMapping struct {
	from netip.AddrPort
	sent int64 // the announcement's time: only a newer one moves it
	at   time.Time
}

func newNATTraversal(outbound bool, keys func() [][]byte, now func() time.Time) *natTraversal {
	return &natTraversal{
		outbound: outbound, keys: keys, now: now,
		dialBacks: make(chan struct{}, maxDialBacks),
		sentTo:    make(map[netip.AddrPort]time.Time),
		behind:    make(map[netip.AddrPort]bool),
		seen:      make(map[netip.AddrPort]natMapping),
		pending:   make(map[[natNonceLen]byte]chan<- net.Conn),
	}
}

// isNATPacket reports whether b is one of ours rather than memberlist's.
func isNATPacket(b []byte) bool {
	return len(b) >= 3 && b[0] == natMagic[0] && b[1] == natMagic[1] && b[2] == natMagic[2]
}

// sealNAT builds a packet of kind with payload, signed with the primary key.
func (n *natTraversal) sealNAT(kind byte, payload []byte) []byte {
	keys := n.keys()
	if len(keys) == 0 {
		return nil
	}
	b := make([]byte, 0, natHeaderLen+len(payload)+natMACLen)
	b = append(b, natMagic[:]...)
	b = append(b, kind)
	b = binary.BigEndian.AppendUint64(b, uint64(n.now().UnixNano()))
	b = append(b, payload...)
	return append(b, natMAC(keys[0], b)...)
}

func natMAC(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(natDomain))
	m.Write(body)
	return m.Sum(nil)[:natMACLen]
}

// natPacket is a decoded packet.
type natPacket struct {
	kind      byte
	sent      int64
	advertise netip.AddrPort    // natAnnounce
	nonce     [natNonceLen]byte // natDialBack
}

// decodeNATPacket parses b and checks its signature against every key and
// its time against now. It never panics.
func decodeNATPacket(b []byte, keys [][]byte, now time.Time) (natPacket, error) {
	var p natPacket
	if !isNATPacket(b) || len(b) < natHeaderLen+natMACLen {
		return p, fmt.Errorf("%w: %d bytes", errNATPacket, len(b))
	}
	body, mac := b[:len(b)-natMACLen], b[len(b)-natMACLen:]
	signed := false
	for _, k := range keys {
		if hmac.Equal(natMAC(k, body), mac) {
			signed = true
			break
		}
	}
	if !signed {
		return p, fmt.Errorf("%w: not signed with a federation key", errNATPacket)
	}
	p.kind = body[3]
	p.sent = int64(binary.BigEndian.Uint64(body[4:12]))
	if d := now.Sub(time.Unix(0, p.sent)); d > natClockSkew || d < -natClockSkew {
		return p, fmt.Errorf("%w: sent %s from now", errNATPacket, d.Round(time.Second))
	}
	payload := body[natHeaderLen:]
	switch p.kind {
	case natAnnounce:
		if len(payload) < 1 || int(payload[0]) != len(payload)-1 {
			return p, fmt.Errorf("%w: announcement of %d bytes", errNATPacket, len(payload))
		}
		// Only the canonical form: one address has one spelling.
		ap, err := netip.ParseAddrPort(string(payload[1:]))
		if err != nil || ap.Port() == 0 || ap.Addr().Is4In6() || ap.Addr().Zone() != "" || ap.String() != string(payload[1:]) {
			return p, fmt.Errorf("%w: announced address %q", errNATPacket, payload[1:])
		}
		p.advertise = ap
	case natDialBack:
		if len(payload) != natNonceLen {
			return p, fmt.Errorf("%w: dial-back request of %d bytes", errNATPacket, len(payload))
		}
		copy(p.nonce[:], payload)
	default:
		return p, fmt.Errorf("%w: kind %d", errNATPacket, p.kind)
	}
	return p, nil
}

// announcement returns the packet to send to dst before a packet of
// memberlist's, or nil when dst had one within announceEvery (or this
// member is not behind NAT). force sends one anyway (before a stream).
func (n *natTraversal) announcement(dst netip.AddrPort, force bool) []byte {
	if !n.outbound {
		return nil
	}
	now := n.now()
	n.mu.Lock()
	last, ok := n.sentTo[dst]
	if ok && !force && now.Sub(last) < announceEvery {
		n.mu.Unlock()
		return nil
	}
	if !ok && len(n.sentTo) >= natTableMax {
		forgetOlder(n.sentTo, now.Add(-natForget), func(t time.Time) time.Time { return t })
		if len(n.sentTo) >= natTableMax {
			n.mu.Unlock()
			return nil
		}
	}
	n.sentTo[dst] = now
	adv := n.advertise.String()
	n.mu.Unlock()
	return n.sealNAT(natAnnounce, append([]byte{byte(len(adv))}, adv...))
}

// forgetOlder drops the entries of m older than before.
func forgetOlder[K comparable, V any](m map[K]V, before time.Time, at func(V) time.Time) {
	for k, v := range m {
		if at(v).Before(before) {
			delete(m, k)
		}
	}
}

// setAdvertise sets the gossip address this member announces.
func (n *natTraversal) setAdvertise(a netip.AddrPort) {
	n.mu.Lock()
	n.advertise = a
	n.mu.Unlock()
}

// setBehind records whether the member advertising addr is behind NAT, as
// its verified record says.
func (n *natTraversal) setBehind(addr netip.AddrPort, outbound bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !outbound {
		delete(n.behind, addr)
		return
	}
	if len(n.behind) < natTableMax {
		n.behind[addr] = true
	}
}

// route returns where a packet memberlist addresses to addr goes: the
// mapping it announced itself from when it is behind NAT, else addr.
func (n *natTraversal) route(addr netip.AddrPort) (netip.AddrPort, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.behind[addr] {
		return addr, false
	}
	m, ok := n.seen[addr]
	if !ok {
		return addr, false
	}
	return m.from, true
}

// announced notes that the member advertising p.advertise is reachable at
// from. Only a newer announcement moves a mapping: a replay does not.
func (n *natTraversal) announced(p natPacket, from netip.AddrPort) {
	now := n.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.seen[p.advertise]
	if ok && p.sent <= m.sent {
		return
	}
	if !ok && len(n.seen) >= natTableMax {
		forgetOlder(n.seen, now.Add(-natForget), func(m natMapping) time.Time { return m.at })
		if len(n.seen) >= natTableMax {
			return
		}
	}
	n.seen[p.advertise] = natMapping{from: from, sent: p.sent, at: now}
}

// mayDialBack reports whether this member (behind NAT) dials back to
// from: only to a member it announced itself to within natForget, so a
// request cannot send it anywhere else.
func (n *natTraversal) mayDialBack(from netip.AddrPort) bool {
	if !n.outbound {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	last, ok := n.sentTo[from]
	return ok && n.now().Sub(last) < natForget
}

// expectDialBack registers a dial-back and returns its request packet and
// the channel its stream arrives on; cancel forgets it.
func (n *natTraversal) expectDialBack() (req []byte, ch <-chan net.Conn, cancel func(), err error) {
	var nonce [natNonceLen]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, nil, nil, fmt.Errorf("dial-back nonce: %w", err)
	}
	c := make(chan net.Conn, 1)
	n.mu.Lock()
	if len(n.pending) >= natTableMax {
		n.mu.Unlock()
		return nil, nil, nil, errors.New("too many dial-backs waiting")
	}
	n.pending[nonce] = c
	n.mu.Unlock()
	cancel = func() {
		n.mu.Lock()
		delete(n.pending, nonce)
		n.mu.Unlock()
		// A stream handed over after the dial gave up is nobody's.
		select {
		case late := <-c:
			_ = late.Close()
		default:
		}
	}
	return n.sealNAT(natDialBack, nonce[:]), c, cancel, nil
}

// dialedBack hands a stream that starts with a dial-back preamble to the
// dial waiting for its nonce, and reports whether one was.
func (n *natTraversal) dialedBack(nonce [natNonceLen]byte, c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch, ok := n.pending[nonce]
	if !ok {
		return false
	}
	delete(n.pending, nonce)
	ch <- c // buffered, one per nonce; under mu, so cancel sees it
	return true
}

func dialBackPreamble(nonce [natNonceLen]byte) []byte {
	b := append(natMagic[:], natDialed)
	return append(b, nonce[:]...)
}
