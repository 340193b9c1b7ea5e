package fabric

import "time"

// SetResyncInterval changes how often Run reads everything back without
// an event; tests set it long to show that events alone drive repairs.
func SetResyncInterval(f *Fabric, d time.Duration) { f.resync = d }

// SetEventBuffer sets the receive buffer of a kind of event stream
// ("rtnetlink", "nftables") for the next subscriptions.
func SetEventBuffer(f *Fabric, kind string, n int) {
	f.buffersMu.Lock()
	defer f.buffersMu.Unlock()
	if f.buffers == nil {
		f.buffers = map[string]int{}
	}
	f.buffers[kind] = n
}
