package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

const (
	// dialBackTimeout bounds a member behind NAT dialing back.
	dialBackTimeout = 5 * time.Second
	// dialBackResend: a dial-back request not answered by then is sent
	// once more (a lost packet should not cost memberlist's whole
	// stream timeout).
	dialBackResend = time.Second
	// streamPeek bounds the wait for a stream's first byte.
	streamPeek = 10 * time.Second
)

var errTransportClosed = errors.New("gossip transport closed")

// natPacket handles one of nat.go's packets from from.
func (t *transport) natPacket(b []byte, from netip.AddrPort) {
	n := t.gates.nat
	p, err := decodeNATPacket(b, n.keys(), n.now())
	if err != nil {
		t.log.Debug("gossip NAT packet refused", "from", from, "err", err)
		return
	}
	switch p.kind {
	case natAnnounce:
		n.announced(p, from)
	case natDialBack:
		if !n.mayDialBack(from) {
			t.log.Debug("dial-back request from a member this one never reached refused", "from", from)
			return
		}
		select {
		case n.dialBacks <- struct{}{}:
		default:
			return // enough in flight; the requester's resend or next try
		}
		t.wg.Add(1)
		go t.serveDialBack(from, p.nonce)
	}
}

// serveDialBack dials the member at to, which asked for a stream, and
// serves it as an accepted one.
func (t *transport) serveDialBack(to netip.AddrPort, nonce [natNonceLen]byte) {
	defer t.wg.Done()
	defer func() { <-t.gates.nat.dialBacks }()
	ctx, cancel := context.WithTimeout(t.ctx, dialBackTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", to.String())
	if err != nil {
		t.log.Debug("dial back", "to", to, "err", err)
		return
	}
	tc := c.(*net.TCPConn)
	_ = tc.SetWriteDeadline(time.Now().Add(dialBackTimeout))
	if _, err := tc.Write(dialBackPreamble(nonce)); err != nil {
		_ = tc.Close()
		t.log.Debug("dial back", "to", to, "err", err)
		return
	}
	_ = tc.SetWriteDeadline(time.Time{})
	var conn net.Conn = tc
	if t.gates.streams != nil {
		if conn = t.gates.streams.admit(tc); conn == nil {
			return
		}
	}
	select {
	case t.streams <- conn:
	case <-t.done:
		_ = conn.Close()
	}
}

// dialBack asks the member advertising member, behind NAT and reached at
// via, to open a stream to this one, and returns that stream.
func (t *transport) dialBack(member, via netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	req, ch, cancel, err := t.gates.nat.expectDialBack()
	if err != nil {
		return nil, fmt.Errorf("stream to %s behind NAT: %w", member, err)
	}
	defer cancel()
	if _, err := t.udp.WriteToUDPAddrPort(req, via); err != nil {
		return nil, fmt.Errorf("stream to %s behind NAT: dial-back request to %s: %w", member, via, err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	resend := time.NewTimer(min(dialBackResend, timeout/2))
	defer resend.Stop()
	for {
		select {
		case c := <-ch:
			return c, nil
		case <-resend.C:
			_, _ = t.udp.WriteToUDPAddrPort(req, via)
		case <-deadline.C:
			return nil, fmt.Errorf("stream to %s behind NAT: no dial-back from %s within %s", member, via, timeout)
		case <-t.done:
			return nil, errTransportClosed
		}
	}
}

// sortStream reads an accepted stream's first byte: a dial-back goes to
// the dial waiting for it, anything else to memberlist, first byte
// included.
func (t *transport) sortStream(c net.Conn) {
	defer t.wg.Done()
	if !t.peeking(c, true) {
		_ = c.Close()
		return
	}
	var first [natStreamPreamble]byte
	_ = c.SetReadDeadline(time.Now().Add(streamPeek))
	_, err := io.ReadFull(c, first[:1])
	if err == nil && first[0] == natMagic[0] {
		_, err = io.ReadFull(c, first[1:])
	}
	t.peeking(c, false)
	switch {
	case err != nil:
		_ = c.Close()
		return
	case first[0] == natMagic[0]:
		var nonce [natNonceLen]byte
		copy(nonce[:], first[4:])
		if first[1] != natMagic[1] || first[2] != natMagic[2] || first[3] != natDialed || !t.gates.nat.dialedBack(nonce, c) {
			_ = c.Close()
		}
		return
	}
	// memberlist sets its own deadlines on the streams it serves.
	conn := &prefixedConn{Conn: c, prefix: []byte{first[0]}}
	select {
	case t.streams <- conn:
	case <-t.done:
		_ = conn.Close()
	}
}

// peeking adds c to (or removes it from) the streams whose first bytes
// are being read, which Shutdown closes; it reports false when the
// transport is already shut down.
func (t *transport) peeking(c net.Conn, add bool) bool {
	t.peekMu.Lock()
	defer t.peekMu.Unlock()
	if !add {
		delete(t.peeks, c)
		return true
	}
	if t.closing() {
		return false
	}
	t.peeks[c] = struct{}{}
	return true
}

// closePeeks closes the streams whose first bytes are being read.
func (t *transport) closePeeks() {
	t.peekMu.Lock()
	defer t.peekMu.Unlock()
	for c := range t.peeks {
		_ = c.Close()
	}
}

// prefixedConn gives back the bytes read off a stream before its reader
// got it.
type prefixedConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixedConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
