package version

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
)

// MaxEncoded bounds a build another binary wrote (an agent's /build): one
// is a few hundred bytes.
const MaxEncoded = 64 << 10

// Parse reads a build another binary wrote, as Info encodes it. Fields it
// does not know are what a newer build adds: ignored. What is not JSON,
// a build without a version, text a terminal would act on and a protocol
// range that is not one are refused, saying which.
func Parse(data []byte) (Info, error) {
	if len(data) > MaxEncoded {
		return Info{}, fmt.Errorf("build of %d bytes, over %d", len(data), MaxEncoded)
	}
	var b Info
	if err := json.Unmarshal(data, &b); err != nil {
		return Info{}, fmt.Errorf("build is not JSON: %w", err)
	}
	if b.Version == "" {
		return Info{}, errors.New("build names no version")
	}
	for name, s := range map[string]string{"version": b.Version, "commit": b.Commit, "date": b.Date, "goVersion": b.GoVersion, "platform": b.Platform} {
		if len(s) > 256 {
			return Info{}, fmt.Errorf("build's %s of %d bytes, over 256", name, len(s))
		}
		for _, r := range s {
			if !unicode.IsPrint(r) {
				return Info{}, fmt.Errorf("build's %s %q holds a character that is not printable", name, s)
			}
		}
	}
	if err := b.Protocol.check(); err != nil {
		return Info{}, fmt.Errorf("build's %w", err)
	}
	return b, nil
}

// check refuses a range that is not one: the version written must be one
// of those read, and version 0 is none.
func (p Protocol) check() error {
	if p.Min < 1 || p.Min > p.Current || p.Current > p.Max {
		return fmt.Errorf("protocol range: writes %d, reads %d to %d: not a range", p.Current, p.Min, p.Max)
	}
	return nil
}

// Reads reports whether a build of range p reads version v.
func (p Protocol) Reads(v int) bool { return p.Min <= v && v <= p.Max }

// Interoperates reports whether builds of ranges p and q read what the
// other writes: what peering requires of two agents (each refuses a
// statement of a version outside its range).
func (p Protocol) Interoperates(q Protocol) bool { return p.Reads(q.Current) && q.Reads(p.Current) }
