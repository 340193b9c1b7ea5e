package discovery

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func startTransport(t testing.TB) *transport {
	t.Helper()
	tr, err := newTransport(netip.MustParseAddrPort("127.0.0.1:0"), slog.New(slog.DiscardHandler), gates{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown() })
	return tr
}

func receivePacket(t testing.TB, tr *transport) *memberlist.Packet {
	t.Helper()
	select {
	case p := <-tr.PacketCh():
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no packet received")
		return nil
	}
}

// Every packet reaches memberlist whole, with its sender, in a buffer that
// holds the packet and no more (memberlist's own transport hands over a
// 64 KiB buffer for each).
func TestTransportDeliversEachPacketInABufferOfItsSize(t *testing.T) {
	tr := startTransport(t)
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(tr.Port()))
	sender, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	for _, size := range []int{1, 64, 1400, 9000, 65507} {
		want := bytes.Repeat([]byte{byte(size)}, size)
		want[0] = 0xA5
		before := time.Now()
		if _, err := sender.WriteToUDPAddrPort(want, to); err != nil {
			t.Fatalf("send %d bytes: %v", size, err)
		}
		p := receivePacket(t, tr)
		if !bytes.Equal(p.Buf, want) {
			t.Fatalf("%d bytes sent, %d received (or other content)", size, len(p.Buf))
		}
		if cap(p.Buf) != size {
			t.Errorf("%d-byte packet in a buffer of %d bytes", size, cap(p.Buf))
		}
		if p.From.String() != sender.LocalAddr().String() {
			t.Errorf("packet from %s, want %s", p.From, sender.LocalAddr())
		}
		if p.Timestamp.Before(before) {
			t.Errorf("packet stamped %s, before it was sent (%s)", p.Timestamp, before)
		}
	}
}

// Packets memberlist sends arrive at the address it names, and its
// streams connect both ways.
func TestTransportSendsPacketsAndCarriesStreams(t *testing.T) {
	a, b := startTransport(t), startTransport(t)
	bAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(b.Port())).String()
	if _, err := a.WriteToAddress([]byte("ping"), memberlist.Address{Addr: bAddr, Name: "b"}); err != nil {
		t.Fatal(err)
	}
	p := receivePacket(t, b)
	if string(p.Buf) != "ping" || p.From.(*net.UDPAddr).Port != a.Port() {
		t.Fatalf("b received %q from %s, want \"ping\" from port %d", p.Buf, p.From, a.Port())
	}

	// A host name is resolved.
	if _, err := a.WriteTo([]byte("by name"), net.JoinHostPort("localhost", strconv.Itoa(b.Port()))); err != nil {
		t.Fatal(err)
	}
	if p := receivePacket(t, b); string(p.Buf) != "by name" {
		t.Fatalf("b received %q, want \"by name\"", p.Buf)
	}

	c, err := a.DialTimeout(bAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var s net.Conn
	select {
	case s = <-b.StreamCh():
	case <-time.After(10 * time.Second):
		t.Fatal("no stream accepted")
	}
	defer s.Close()
	if _, err := c.Write([]byte("push-pull")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("push-pull"))
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "push-pull" {
		t.Fatalf("stream read %q, %v", got, err)
	}
}

// The advertised port is the bound one unless another is given, and a
// bound address is advertised as itself.
func TestTransportAdvertisesTheBoundAddress(t *testing.T) {
	tr := startTransport(t)
	for _, tc := range []struct {
		ip       string
		port     int
		wantIP   string
		wantPort int
	}{
		{"", 0, "127.0.0.1", tr.Port()},
		{"192.0.2.7", 0, "192.0.2.7", tr.Port()},
		{"192.0.2.7", 7946, "192.0.2.7", 7946},
	} {
		ip, port, err := tr.FinalAdvertiseAddr(tc.ip, tc.port)
		if err != nil {
			t.Fatalf("%q:%d: %v", tc.ip, tc.port, err)
		}
		if ip.String() != tc.wantIP || port != tc.wantPort {
			t.Errorf("%q:%d advertised as %s:%d, want %s:%d", tc.ip, tc.port, ip, port, tc.wantIP, tc.wantPort)
		}
	}
	if _, _, err := tr.FinalAdvertiseAddr("gw.example.org", 0); err == nil {
		t.Error("a host name was accepted as the advertise address")
	}
}

// Shutdown returns even when a received packet and a stream wait for a
// memberlist that no longer reads them, and frees the port.
func TestTransportShutdownDoesNotWaitForAReader(t *testing.T) {
	tr := startTransport(t)
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(tr.Port()))
	sender, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	if _, err := sender.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The listener is reading (positive witness); the second packet is
	// then left waiting for a reader that never comes.
	first := receivePacket(t, tr)
	if string(first.Buf) != "unread" {
		t.Fatalf("received %q", first.Buf)
	}
	if _, err := sender.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Shutdown(); err != nil {
		t.Fatal(err)
	}
	again, err := newTransport(addr, slog.New(slog.DiscardHandler), gates{})
	if err != nil {
		t.Fatalf("port not freed by shutdown: %v", err)
	}
	_ = again.Shutdown()
}

// BenchmarkTransportReceive is the memory allocated per packet received
// (B/op, allocs/op), ours against memberlist's NetTransport, for a
// 1,400-byte gossip packet.
func BenchmarkTransportReceive(b *testing.B) {
	for _, tc := range []struct {
		name  string
		start func(b *testing.B) (memberlist.Transport, int)
	}{
		{"memberlist-net", func(b *testing.B) (memberlist.Transport, int) {
			nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
				BindAddrs: []string{"127.0.0.1"},
				Logger:    memberlistLogger(slog.New(slog.DiscardHandler), nil, nil),
			})
			if err != nil {
				b.Fatal(err)
			}
			return nt, nt.GetAutoBindPort()
		}},
		{"flotilla", func(b *testing.B) (memberlist.Transport, int) {
			tr := startTransport(b)
			return tr, tr.Port()
		}},
	} {
		b.Run("transport="+tc.name, func(b *testing.B) {
			tr, port := tc.start(b)
			defer tr.Shutdown()
			to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
			sender, err := net.DialUDP("udp", nil, to)
			if err != nil {
				b.Fatal(err)
			}
			defer sender.Close()
			pkt := make([]byte, 1400)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := sender.Write(pkt); err != nil {
					b.Fatal(err)
				}
				<-tr.PacketCh()
			}
		})
	}
}
