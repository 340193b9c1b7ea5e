package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

const (
	// maxPacket is the largest UDP payload; the one read buffer of a
	// listener holds it, whatever a peer sends.
	maxPacket = 65535
	// udpReadBuffer is the kernel receive buffer asked for the gossip
	// socket (halved until the kernel takes it): a burst of acks and
	// gossip must not be dropped while the process is busy.
	udpReadBuffer = 2 << 20
)

// transport carries memberlist's packets over UDP and its streams over
// TCP on one address, as memberlist's own NetTransport does, with one
// difference that matters at scale: NetTransport reads every packet into a
// fresh 64 KiB buffer, so a member receiving ten packets a second makes
// 640 KiB of garbage a second for packets of at most 1.4 KB. 100 members
// in one process (the detection benchmark) made 60 MB/s of it, and the
// garbage collection it cost is CPU that, on a loaded machine, turns late
// acks into suspicions. Here each listener reads into one buffer of its
// own and hands memberlist a copy of exactly the packet's size.
type transport struct {
	udp  *net.UDPConn
	tcp  *net.TCPListener
	port int
	log  *slog.Logger
	// gates bound what other hosts send; a nil one admits everything
	// (benchmarks of memberlist itself).
	gates gates

	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	close   sync.Once
	wg      sync.WaitGroup
	// ctx ends with done, for dials.
	ctx  context.Context
	stop context.CancelFunc
	// peeks are the streams whose first bytes are being read (nat.go).
	peekMu sync.Mutex
	peeks  map[net.Conn]struct{}
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// gates admit what other hosts send before memberlist reads it: the
// streams (TCP) and the packets (UDP).
type gates struct {
	streams *streamGate
	packets *packetGate
	// nat, when set, reaches members behind NAT, and this member when it
	// is behind one, through the connections they open (nat.go).
	nat *natTraversal
}

// newTransport listens on addr, TCP and UDP on one port. Port 0 picks a
// port free for both. g's gates, where set, admit streams and packets.
func newTransport(addr netip.AddrPort, log *slog.Logger, g gates) (*transport, error) {
	var lastErr error
	// With port 0 the kernel picks a TCP port, and that port may be taken
	// for UDP: try a few.
	tries := 1
	if addr.Port() == 0 {
		tries = 10
	}
	for range tries {
		t, err := listen(addr, log, g)
		if err == nil {
			return t, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func listen(addr netip.AddrPort, log *slog.Logger, g gates) (*transport, error) {
	tcp, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("listen for gossip streams on tcp %s: %w", addr, err)
	}
	port := tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr.Addr(), uint16(port))))
	if err != nil {
		_ = tcp.Close()
		return nil, fmt.Errorf("listen for gossip packets on udp %s port %d: %w", addr.Addr(), port, err)
	}
	for size := udpReadBuffer; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	t := &transport{
		udp:     udp,
		tcp:     tcp,
		port:    port,
		log:     log,
		gates:   g,
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
		peeks:   make(map[net.Conn]struct{}),
	}
	t.ctx, t.stop = context.WithCancel(context.Background())
	t.wg.Add(2)
	go t.readPackets()
	go t.acceptStreams()
	return t, nil
}

// Port is the port listened on (the one picked, for port 0).
func (t *transport) Port() int { return t.port }

// FinalAdvertiseAddr is the address given, or the bound one; port 0 means
// the bound port.
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if port == 0 {
		port = t.port
	}
	if ip == "" {
		a := t.tcp.Addr().(*net.TCPAddr).IP
		if !a.IsUnspecified() {
			return a, port, nil
		}
		// Bound to every address: advertise a private one, as
		// memberlist's own transport does.
		priv, err := sockaddr.GetPrivateIP()
		if err != nil {
			return nil, 0, fmt.Errorf("find a private address to advertise: %w", err)
		}
		if priv == "" {
			return nil, 0, errors.New("gossip bound to every address and none is private: set an advertise address")
		}
		ip = priv
	}
	a := net.ParseIP(ip)
	if a == nil {
		return nil, 0, fmt.Errorf("advertise address %q is not an IP address", ip)
	}
	if a4 := a.To4(); a4 != nil {
		a = a4
	}
	return a, port, nil
}

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	// Member addresses are IP:port; parsing them needs no allocation,
	// unlike a resolution.
	if ap, err := netip.ParseAddrPort(a.Addr); err == nil {
		if n := t.gates.nat; n != nil {
			ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
			if ann := n.announcement(ap, false); ann != nil {
				_, _ = t.udp.WriteToUDPAddrPort(ann, ap)
			}
			ap, _ = n.route(ap)
		}
		_, err = t.udp.WriteToUDPAddrPort(b, ap)
		return time.Now(), err
	}
	ua, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, fmt.Errorf("gossip packet to %s: %w", a.Addr, err)
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if n := t.gates.nat; n != nil {
		if ap, err := netip.ParseAddrPort(a.Addr); err == nil {
			ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
			// Behind NAT: the member learns where this one is before
			// the stream's first bytes, and can answer by packet at once.
			if ann := n.announcement(ap, true); ann != nil {
				_, _ = t.udp.WriteToUDPAddrPort(ann, ap)
			}
			if to, ok := n.route(ap); ok {
				return t.dialBack(ap, to, timeout)
			}
		}
	}
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", a.Addr)
}

func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes both listeners and waits for their goroutines, which
// give up a packet or stream nobody takes any more.
func (t *transport) Shutdown() error {
	t.close.Do(func() {
		t.peekMu.Lock()
		close(t.done)
		t.peekMu.Unlock()
		t.stop()
		_ = t.tcp.Close()
		_ = t.udp.Close()
		t.closePeeks()
	})
	t.wg.Wait()
	return nil
}

func (t *transport) closing() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// readPackets hands every packet received to memberlist, each in a buffer
// of its own size.
func (t *transport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		now := time.Now() // as close to the read as can be: probe RTTs use it
		if err != nil {
			if t.closing() {
				return
			}
			t.log.Warn("read gossip packet", "err", err)
			continue
		}
		if n == 0 {
			continue // memberlist needs at least the message type
		}
		if t.gates.packets != nil && !t.gates.packets.allow(from.Addr().Unmap()) {
			continue
		}
		if t.gates.nat != nil && isNATPacket(buf[:n]) {
			t.natPacket(buf[:n], netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
			continue
		}
		p := &memberlist.Packet{
			Buf:       exactCopy(buf[:n]),
			From:      net.UDPAddrFromAddrPort(from),
			Timestamp: now,
		}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		}
	}
}

// exactCopy copies b into a buffer of exactly its length (append would
// round the capacity up to a size class).
func exactCopy(b []byte) []byte {
	c := make([]byte, len(b))
	copy(c, b)
	return c
}

// acceptStreams hands every TCP connection the gate admits to memberlist.
func (t *transport) acceptStreams() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closing() {
				return
			}
			// Out of file descriptors and the like: back off rather
			// than spin, up to a second.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("accept gossip stream", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-t.done:
				return
			}
			continue
		}
		delay = 0
		var conn net.Conn = c
		if t.gates.streams != nil {
			if conn = t.gates.streams.admit(c); conn == nil {
				continue
			}
		}
		if t.gates.nat != nil {
			// A stream may be a dial-back: read its first bytes away
			// from this loop.
			t.wg.Add(1)
			go t.sortStream(conn)
			continue
		}
		select {
		case t.streams <- conn:
		case <-t.done:
			_ = conn.Close()
			return
		}
	}
}

// String names the transport's address in logs.
func (t *transport) String() string {
	return net.JoinHostPort(t.tcp.Addr().(*net.TCPAddr).IP.String(), strconv.Itoa(t.port))
}
