package tunnel

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// deviceBatch is the batch our userspace device works in: the packets
// it reads from a socket or the TUN at once, encrypts and sends at once.
//
// wireguard-go sizes its read batches by the bind's and the TUN's
// BatchSize (128 with UDP GRO and TUN offloads) and gives each reader,
// one per UDP socket (IPv4, IPv6) and one for the TUN, that many buffers
// of 64 KiB for the device's life: 24 MiB of Go heap. Few of their pages
// are ever written, but the garbage collector counts them all as live
// and lets the heap grow by as much again before it collects, which
// doubled what an agent with 100 peers keeps resident. Reporting 16 to
// the device keeps 3 MiB of them; the 128 the kernel hands over at once
// (a GRO'd burst, a TSO superpacket of up to 48 segments) land in one
// full-size batch of our own, outside the Go heap (batchBuffers), and
// go to the device 16 at a time.
const deviceBatch = 16

// batchBuffers is a batch of n buffers of device.MaxMessageSize in
// anonymous memory mapped outside the Go heap: the garbage collector
// neither counts nor scans it, and a page takes memory only once
// written (a packet of 1500 bytes touches one of the 16 of its buffer).
type batchBuffers struct {
	bufs   [][]byte
	region []byte
}

func newBatchBuffers(n int) (*batchBuffers, error) {
	region, err := unix.Mmap(-1, 0, n*device.MaxMessageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map %d buffers of %d bytes for wireguard-go's batches: %w", n, device.MaxMessageSize, err)
	}
	b := &batchBuffers{region: region, bufs: make([][]byte, n)}
	for i := range b.bufs {
		b.bufs[i] = region[i*device.MaxMessageSize : (i+1)*device.MaxMessageSize : (i+1)*device.MaxMessageSize]
	}
	// Unmapped once nothing reads into it any more: the reader that owns
	// it may still be inside a read when its bind or TUN is closed.
	runtime.AddCleanup(b, func(region []byte) { unix.Munmap(region) }, region)
	return b, nil
}

// pending is what one read of the inner bind or TUN gave and the device
// has not taken yet: packets next to n of bufs, and the read's error,
// returned with the last of them.
type pending struct {
	*batchBuffers
	sizes     []int
	next, n   int
	err       error
	endpoints []conn.Endpoint // the bind's only
}

// drained reports whether everything read was handed on.
func (p *pending) drained() bool { return p.next == p.n && p.err == nil }

// handOn copies up to len(bufs) pending packets into bufs at offset, with
// their sizes and, for a bind, endpoints into eps; the read's error comes
// with the last packet (or alone).
func (p *pending) handOn(bufs [][]byte, sizes []int, eps []conn.Endpoint, offset int) (int, error) {
	k := 0
	for ; k < len(bufs) && p.next < p.n; k, p.next = k+1, p.next+1 {
		sizes[k] = copy(bufs[k][offset:], p.bufs[p.next][offset:offset+p.sizes[p.next]])
		if eps != nil {
			eps[k] = p.endpoints[p.next]
			p.endpoints[p.next] = nil
		}
	}
	if p.next < p.n {
		return k, nil
	}
	err := p.err
	p.err = nil
	return k, err
}

// batchedBind reports deviceBatch as its batch size to the device while
// its inner bind reads full batches into batchBuffers.
//
// What it costs: wireguard-go starts its route listener only for its own
// *conn.StdNetBind. The bind inside still replies from the address each
// peer's packets came to (sticky sockets); what goes is the listener's
// forgetting that address when the route to a peer changes, so until the
// peer's next packet or a new endpoint set by the tunnel, a reply may
// leave from an address the host no longer has.
type batchedBind struct {
	conn.Bind
	batch int
}

func newBatchedBind(inner conn.Bind, batch int) conn.Bind {
	if inner.BatchSize() <= batch {
		return inner
	}
	return &batchedBind{Bind: inner, batch: batch}
}

func (b *batchedBind) BatchSize() int { return b.batch }

// Open wraps each receive function of the inner bind in a reader with a
// full batch of its own; each is called by one goroutine of the device.
func (b *batchedBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, actual, err := b.Bind.Open(port)
	if err != nil {
		return nil, 0, err
	}
	n := b.Bind.BatchSize()
	wrapped := make([]conn.ReceiveFunc, len(fns))
	for i, fn := range fns {
		bufs, err := newBatchBuffers(n)
		if err != nil {
			b.Bind.Close()
			return nil, 0, err
		}
		p := &pending{batchBuffers: bufs, sizes: make([]int, n), endpoints: make([]conn.Endpoint, n)}
		wrapped[i] = func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
			if p.drained() {
				p.n, p.err = fn(p.bufs, p.sizes, p.endpoints)
				p.next = 0
			}
			return p.handOn(packets, sizes, eps, 0)
		}
	}
	return wrapped, actual, nil
}

// batchedTUN reports deviceBatch as its batch size to the device while
// its inner TUN reads full batches (a TSO superpacket split into its
// segments) into batchBuffers. Writes go through: the device writes at
// most its batch at once, and the TUN coalesces what it can of them.
type batchedTUN struct {
	tun.Device
	batch int
	p     pending
}

func newBatchedTUN(inner tun.Device, batch int) (tun.Device, error) {
	n := inner.BatchSize()
	if n <= batch {
		return inner, nil
	}
	bufs, err := newBatchBuffers(n)
	if err != nil {
		return nil, err
	}
	return &batchedTUN{Device: inner, batch: batch, p: pending{batchBuffers: bufs, sizes: make([]int, n)}}, nil
}

func (t *batchedTUN) BatchSize() int { return t.batch }

// Read is called by the device's one TUN reader.
func (t *batchedTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if t.p.drained() {
		t.p.n, t.p.err = t.Device.Read(t.p.bufs, t.p.sizes, offset)
		t.p.next = 0
	}
	return t.p.handOn(bufs, sizes, nil, offset)
}
