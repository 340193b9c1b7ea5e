package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"slices"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
)

// Announce says which of this cluster's pod addresses are announced to
// peers (--announce).
type Announce string

const (
	// AnnounceAuto announces each configured pod range that a peer can
	// remap (no larger than the largest remap pool) whole, and the Nodes'
	// blocks in use of a larger one.
	AnnounceAuto Announce = "auto"
	// AnnounceRange announces the configured pod ranges whole.
	AnnounceRange Announce = "range"
	// AnnounceBlocks announces the pod blocks in use: the Nodes'
	// (spec.podCIDRs) and those a CNI with its own IPAM allocated.
	AnnounceBlocks Announce = "blocks"
)

// ParseAnnounce parses --announce.
func ParseAnnounce(s string) (Announce, error) {
	switch Announce(s) {
	case AnnounceAuto, AnnounceRange, AnnounceBlocks:
		return Announce(s), nil
	}
	return "", fmt.Errorf("announce %q: want auto, range or blocks", s)
}

// announcement is what a cluster announces and, for a person, why.
type announcement struct {
	Networks []netip.Prefix
	// Notes say where the announcement is not what the mode asked for,
	// and why; empty when it is.
	Notes []string
	// Source says where the blocks announced came from (sourceNodes,
	// sourceCalico, ...); empty when the ranges are announced whole.
	Source string
}

// largestPool is the largest IPv4 remap pool: a range larger than it can
// never be remapped by a peer whose view of it must move.
func largestPool(pools []netip.Prefix) int {
	best := 33
	for _, p := range pools {
		if p.Addr().Is4() {
			best = min(best, p.Bits())
		}
	}
	return best
}

// announce decides what to announce of the IPv4 pod ranges, given the
// pod blocks in use. Blocks replace a range only when there are some
// inside it; the range is announced whole otherwise. More networks than
// a Hello carries are announced as the ranges.
func announce(mode Announce, ranges, blocks []netip.Prefix, pools []netip.Prefix) announcement {
	var out announcement
	largest := largestPool(pools)
	for _, r := range ranges {
		if mode == AnnounceRange || mode == AnnounceAuto && r.Bits() >= largest {
			out.Networks = append(out.Networks, r)
			continue
		}
		var inside []netip.Prefix
		for _, b := range blocks {
			if b.Addr().Is4() && b.Bits() >= r.Bits() && r.Contains(b.Addr()) {
				inside = append(inside, b)
			}
		}
		if len(inside) == 0 {
			out.Networks = append(out.Networks, r)
			out.Notes = append(out.Notes, fmt.Sprintf("no pod block is known in %s (no Node's spec.podCIDRs, no Calico BlockAffinity or CiliumNode, no pod's address in it): %s announced whole", r, r))
			continue
		}
		out.Networks = append(out.Networks, aggregate(inside)...)
	}
	if len(out.Networks) > peering.MaxNetworks {
		out.Notes = append(out.Notes, fmt.Sprintf("the pod blocks aggregate to %d networks, more than the %d a peering statement carries: %v announced whole", len(out.Networks), peering.MaxNetworks, ranges))
		out.Networks = slices.Clone(ranges)
	}
	return out
}

// aggregate returns the fewest IPv4 prefixes whose union is exactly the
// union of blocks: four adjacent /24s on a /22 boundary become the /22,
// three stay a /23 and a /24.
func aggregate(blocks []netip.Prefix) []netip.Prefix {
	type span struct{ first, last uint64 } // inclusive, in a uint64 so last+1 never wraps
	var spans []span
	for _, b := range blocks {
		if !b.Addr().Is4() {
			continue
		}
		b = b.Masked()
		first := uint64(u32(b.Addr()))
		spans = append(spans, span{first, first + 1<<(32-b.Bits()) - 1})
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.first != b.first {
			return int(int64(a.first) - int64(b.first))
		}
		return int(int64(b.last) - int64(a.last))
	})
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 && s.first <= merged[n-1].last+1 {
			merged[n-1].last = max(merged[n-1].last, s.last)
			continue
		}
		merged = append(merged, s)
	}
	var out []netip.Prefix
	for _, s := range merged {
		// The largest aligned prefix that starts at first and ends by last,
		// again and again: the classic range-to-CIDR walk, minimal.
		for first := s.first; first <= s.last; {
			size := 32
			if first != 0 {
				size = bits.TrailingZeros64(first)
			}
			for size > 0 && first+(1<<size)-1 > s.last {
				size--
			}
			out = append(out, netip.PrefixFrom(addr4(uint32(first)), 32-size))
			first += 1 << size
		}
	}
	return out
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// announceDebounce gathers a burst of Node changes (nodes registering
// together) into one renegotiation.
const announceDebounce = 200 * time.Millisecond

// announcer keeps what this cluster announces in line with its pod blocks
// in use, and has peering renegotiate when that changes.
type announcer struct {
	log    *slog.Logger
	mode   Announce
	ranges []netip.Prefix // the IPv4 pod ranges
	pools  []netip.Prefix
	// blocks returns the pod blocks in use and, for the log, where they
	// came from; set once they are watched.
	blocks  func() ([]netip.Prefix, string)
	changed chan struct{}

	last announcement // owned by the first caller of current, then run
}

func newAnnouncer(log *slog.Logger, mode Announce, ranges []netip.Prefix) *announcer {
	return &announcer{log: log, mode: mode, ranges: ranges, pools: ipam.DefaultPools, changed: make(chan struct{}, 1)}
}

// notify asks for a new look; it never blocks.
func (n *announcer) notify() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// current computes the announcement; it logs it, and why it is not what
// the mode asked for, once per change. It reports whether it changed.
func (n *announcer) current() (announcement, bool) {
	var blocks []netip.Prefix
	var source string
	if n.blocks != nil {
		blocks, source = n.blocks()
	}
	a := announce(n.mode, n.ranges, blocks, n.pools)
	a.Source = source
	if slices.Equal(a.Networks, n.ranges) {
		a.Source = ""
	}
	changed := !slices.Equal(a.Networks, n.last.Networks)
	if !slices.Equal(a.Notes, n.last.Notes) {
		for _, note := range a.Notes {
			n.log.Warn("announcing pod ranges whole", "mode", n.mode, "why", note)
		}
	}
	if changed || a.Source != n.last.Source {
		n.log.Info("networks announced to peers", "mode", n.mode, "networks", a.Networks, "podRanges", n.ranges, "blocksFrom", a.Source)
	}
	n.last = a
	return a, changed
}

// run has set renegotiate whenever the announcement changes, until ctx
// ends.
func (n *announcer) run(ctx context.Context, set func([]netip.Prefix) error) error {
	var wait <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.changed:
			if wait == nil {
				wait = time.After(announceDebounce)
			}
			continue
		case <-wait:
			wait = nil
		}
		a, changed := n.current()
		if !changed {
			continue
		}
		if err := set(a.Networks); err != nil {
			// announce keeps to what a statement carries; this is a bug.
			n.log.Error("cannot announce the networks", "networks", a.Networks, "err", err)
		}
	}
}
