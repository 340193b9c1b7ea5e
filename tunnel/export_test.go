package tunnel

import (
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// Resync reconciles reading every kind of owned object back from the
// kernel, as the periodic resync does; for benchmarks.
func Resync(t *Tunnel) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reconcileLocked(fullAll)
}

// SetEventBuffer sets the receive buffer of the kernel event stream of
// kind ("route", "link" or "nftables") before Run, so that a test can
// overflow it.
func SetEventBuffer(t *Tunnel, kind string, bytes int) {
	if t.eventBuffer == nil {
		t.eventBuffer = map[string]int{}
	}
	t.eventBuffer[kind] = bytes
}

// SetResyncInterval sets how often Run reads everything back, before Run.
func SetResyncInterval(t *Tunnel, d time.Duration) { t.resync = d }

// Batched wraps a TUN and a bind in batches of n, as the agent's
// userspace device is (deviceBatch), for the benchmarks' bare device.
func Batched(t tun.Device, b conn.Bind, n int) (tun.Device, conn.Bind, error) {
	bt, err := newBatchedTUN(t, n)
	if err != nil {
		return nil, nil, err
	}
	return bt, newBatchedBind(b, n), nil
}

// DeviceBatch is the batch of the agent's userspace device.
const DeviceBatch = deviceBatch

// SetNFTSocketPerOperation makes the tunnel open a netlink socket to
// nf_tables for each operation and close it after (on) or keep one open
// (off, the default), for benchmarks to compare the two.
func SetNFTSocketPerOperation(t *Tunnel, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nft.close()
	t.nft.perOperation = on
}

// HairpinComment and BeyondComment tag the guards' drops, whose counters
// tests read.
const (
	HairpinComment = hairpinComment
	BeyondComment  = beyondComment
)
