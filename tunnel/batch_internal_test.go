package tunnel

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// burstBind is a bind whose one receive function gives each burst in
// one read of up to 128 packets, then net.ErrClosed; a stand-in for the
// kernel's GRO'd bursts.
type burstBind struct {
	conn.Bind
	bursts [][]string
}

func (b *burstBind) BatchSize() int { return conn.IdealBatchSize }

func (b *burstBind) Open(uint16) ([]conn.ReceiveFunc, uint16, error) {
	return []conn.ReceiveFunc{func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		if len(b.bursts) == 0 {
			return 0, net.ErrClosed
		}
		if len(bufs) != conn.IdealBatchSize {
			return 0, fmt.Errorf("read into %d buffers, want %d", len(bufs), conn.IdealBatchSize)
		}
		burst := b.bursts[0]
		b.bursts = b.bursts[1:]
		for i, p := range burst {
			sizes[i] = copy(bufs[i], p)
			eps[i] = &conn.StdNetEndpoint{AddrPort: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(i+1))}
		}
		return len(burst), nil
	}}, 51820, nil
}

func packets(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// The device, reading in batches of 16, gets every packet of bursts of
// 128 and of 3, in order, each with its sender, then the bind's closing.
func TestBatchedBindHandsOnEveryPacket(t *testing.T) {
	inner := &burstBind{bursts: [][]string{packets("a", 128), packets("b", 3)}}
	bind := newBatchedBind(inner, 16)
	if got := bind.BatchSize(); got != 16 {
		t.Fatalf("BatchSize %d, want 16", got)
	}
	fns, _, err := bind.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	bufs, sizes, eps := make([][]byte, 16), make([]int, 16), make([]conn.Endpoint, 16)
	for i := range bufs {
		bufs[i] = make([]byte, device.MaxMessageSize)
	}
	var got []string
	var ports []uint16
	for {
		n, err := fns[0](bufs, sizes, eps)
		if n > 16 {
			t.Fatalf("read %d packets into 16 buffers", n)
		}
		for i := range n {
			got = append(got, string(bufs[i][:sizes[i]]))
			ports = append(ports, eps[i].(*conn.StdNetEndpoint).Port())
		}
		if errors.Is(err, net.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	want := append(packets("a", 128), packets("b", 3)...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got packets %v\nwant %v", got, want)
	}
	if ports[127] != 128 || ports[128] != 1 || ports[130] != 3 {
		t.Errorf("the senders do not follow their packets: %v", ports)
	}
}

// segmentTUN is a TUN whose reads split one superpacket into n segments
// at offset, and report an error with the last read, as a TUN may.
type segmentTUN struct {
	tun.Device
	segments int
	reads    int
}

func (t *segmentTUN) BatchSize() int { return conn.IdealBatchSize }

func (t *segmentTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	t.reads++
	if len(bufs) < t.segments {
		return 0, tun.ErrTooManySegments
	}
	for i := range t.segments {
		sizes[i] = copy(bufs[i][offset:], fmt.Sprintf("segment-%d-%d", t.reads, i))
	}
	if t.reads == 2 {
		return t.segments, errors.New("the last read")
	}
	return t.segments, nil
}

// A superpacket of 48 segments (the most a 64 KiB TSO packet holds at
// an MTU of 1420) reaches the device whole, 16 at a time, at the
// device's offset; the TUN's error comes after the last segment.
func TestBatchedTUNSplitsSuperpackets(t *testing.T) {
	inner := &segmentTUN{segments: 48}
	td, err := newBatchedTUN(inner, 16)
	if err != nil {
		t.Fatal(err)
	}
	if got := td.BatchSize(); got != 16 {
		t.Fatalf("BatchSize %d, want 16", got)
	}
	const offset = device.MessageTransportHeaderSize
	bufs, sizes := make([][]byte, 16), make([]int, 16)
	for i := range bufs {
		bufs[i] = make([]byte, device.MaxMessageSize)
	}
	var got []string
	var readErr error
	for readErr == nil {
		var n int
		n, readErr = td.Read(bufs, sizes, offset)
		for i := range n {
			if !bytes.Equal(bufs[i][:offset], make([]byte, offset)) {
				t.Fatalf("a segment written before the offset: %q", bufs[i][:offset+sizes[i]])
			}
			got = append(got, string(bufs[i][offset:offset+sizes[i]]))
		}
	}
	if readErr.Error() != "the last read" {
		t.Errorf("error %v, want the TUN's", readErr)
	}
	var want []string
	for r := 1; r <= 2; r++ {
		for i := range 48 {
			want = append(want, fmt.Sprintf("segment-%d-%d", r, i))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}
