package harness

import (
	"bytes"
	endian "encoding/binary"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Flood does do n times from workers goroutines at once, and returns once
// every one has returned: the floods of the limits' tests (gossip
// streams, webhook reviews).
func Flood(n, workers int, do func()) {
	var wg sync.WaitGroup
	work := make(chan struct{})
	for range workers {
		wg.Go(func() {
			for range work {
				do()
			}
		})
	}
	for range n {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
}

// Peak samples a value (a heap's size) every interval from SamplePeak on
// until Stop, and keeps the largest.
type Peak struct {
	peak atomic.Uint64
	stop chan struct{}
	wg   sync.WaitGroup
}

// SamplePeak starts sampling read every interval; a sample read fails is
// skipped.
func SamplePeak(interval time.Duration, read func() (uint64, error)) *Peak {
	p := &Peak{stop: make(chan struct{})}
	p.wg.Go(func() {
		for {
			if v, err := read(); err == nil {
				p.peak.Store(max(p.peak.Load(), v))
			}
			select {
			case <-p.stop:
				return
			case <-time.After(interval):
			}
		}
	})
	return p
}

// Stop ends the sampling and returns the largest value read.
func (p *Peak) Stop() uint64 {
	close(p.stop)
	p.wg.Wait()
	return p.peak.Load()
}

// WriteSealedStateClaim writes to a gossip stream what a stranger
// without the federation key can: memberlist's header of an encrypted
// message (type 10) claiming claimed bytes of sealed state, then sent
// bytes of junk. It stops at the first write that fails (the agent cut
// or reset the stream).
func WriteSealedStateClaim(w io.Writer, claimed uint32, sent int) {
	header := make([]byte, 5)
	header[0] = 10 // memberlist's encryptMsg
	endian.BigEndian.PutUint32(header[1:], claimed)
	if _, err := w.Write(header); err != nil {
		return
	}
	junk := bytes.Repeat([]byte{0xa5}, 64<<10)
	for n := 0; n < sent; n += len(junk) {
		if _, err := w.Write(junk); err != nil {
			return
		}
	}
}
