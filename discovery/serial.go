package discovery

import (
	"encoding/binary"
	"fmt"
)

// serialKey names the stored record serial in the SerialStore.
const serialKey = "discovery-serial"

// loadSerial reads the last serial issued before a restart. A stored value
// that is not 8 bytes is replaced at the next issue; until then the clock
// alone orders the serial, as without a store.
func (d *Discovery) loadSerial() error {
	if d.cfg.Serials == nil {
		return nil
	}
	b, err := d.cfg.Serials.LoadOrCreateKey(serialKey, func() ([]byte, error) { return make([]byte, 8), nil })
	if err != nil {
		return fmt.Errorf("load member record serial %q: %w", serialKey, err)
	}
	if len(b) != 8 {
		d.log.Warn("stored member record serial is unreadable; starting from the clock", "key", serialKey, "bytes", len(b))
		return nil
	}
	d.serial = binary.BigEndian.Uint64(b)
	return nil
}

// nextSerial returns a serial above every one issued before, also across
// restarts (it is stored before any record carries it) and clock steps
// (it only grows). The caller holds pubMu.
func (d *Discovery) nextSerial() (uint64, error) {
	s := d.serial + 1
	if ns := d.cfg.Now().UnixNano(); ns > 0 && uint64(ns) > s {
		s = uint64(ns)
	}
	if d.cfg.Serials != nil {
		if err := d.cfg.Serials.PutKey(serialKey, binary.BigEndian.AppendUint64(nil, s)); err != nil {
			return 0, fmt.Errorf("store member record serial: %w", err)
		}
	}
	d.serial = s
	return s, nil
}
