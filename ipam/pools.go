package ipam

import (
	"math"
	"net/netip"
	"slices"
	"time"
)

// PoolUsage is how much of one remap pool is taken, for the operator who
// must act before a peer's view finds no room (ErrExhausted).
type PoolUsage struct {
	Pool netip.Prefix
	// Addresses is the pool's size and Used how many of its addresses
	// views, quarantined blocks and local networks take. Floats: an IPv6
	// pool holds more than 2^64.
	Addresses, Used float64
	// LargestFree is the largest block a new view could still get: the
	// shortest prefix length of a free aligned block in the pool, or -1
	// when the pool is full. A peer range longer than it no longer fits.
	LargestFree int
}

// PoolUsage returns the usage of each remap pool, in the order they are
// tried.
func (l *Ledger) PoolUsage() []PoolUsage {
	var out []PoolUsage
	l.read(func(st *state) {
		now := l.now()
		occ := map[bool]spans{}
		for _, v4 := range []bool{true, false} {
			occ[v4] = merge(occupiedIn(st, v4, now))
		}
		for _, pool := range l.pools {
			out = append(out, usageOf(pool, occ[pool.Addr().Is4()]))
		}
	})
	return out
}

// occupiedIn lists the ranges of one family in use: local networks, views
// and blocks still in quarantine at now, sorted by first address.
func occupiedIn(st *state, v4 bool, now time.Time) spans {
	var out spans
	add := func(p netip.Prefix) {
		if p.Addr().Is4() == v4 {
			out = append(out, spanOf(p))
		}
	}
	for _, n := range st.locals {
		add(n.Range)
	}
	for _, v := range st.views {
		add(v.View)
	}
	for b, q := range st.quarantine {
		if now.Before(q.Until) {
			add(b)
		}
	}
	slices.SortFunc(out, compareSpans)
	return out
}

// merge joins overlapping and adjacent spans of a sorted list.
func merge(s spans) spans {
	var out spans
	for _, x := range s {
		if n := len(out); n > 0 {
			end, overflow := out[n-1].last.add(u128{lo: 1})
			if overflow || !end.less(x.first) {
				if out[n-1].last.less(x.last) {
					out[n-1].last = x.last
				}
				continue
			}
		}
		out = append(out, x)
	}
	return out
}

// usageOf counts what of pool the merged spans occ take and finds its
// largest free aligned block.
func usageOf(pool netip.Prefix, occ spans) PoolUsage {
	width := pool.Addr().BitLen()
	ps := spanOf(pool)
	u := PoolUsage{Pool: pool, Addresses: math.Ldexp(1, width-pool.Bits()), LargestFree: -1}
	free := func(first, last u128) {
		if bits := largestAligned(first, last, width, pool.Bits()); bits >= 0 && (u.LargestFree < 0 || bits < u.LargestFree) {
			u.LargestFree = bits
		}
	}
	next := ps.first // the first address not yet accounted for
	done := false
	for _, o := range occ {
		if o.last.less(ps.first) || ps.last.less(o.first) {
			continue
		}
		first, last := maxU(o.first, ps.first), minU(o.last, ps.last)
		if next.less(first) {
			gapEnd, _ := first.sub(u128{lo: 1})
			free(next, gapEnd)
		}
		u.Used += count(first, last)
		var overflow bool
		if next, overflow = last.add(u128{lo: 1}); overflow || ps.last.less(next) {
			done = true
			break
		}
	}
	if !done {
		free(next, ps.last)
	}
	return u
}

// largestAligned is the shortest prefix length, from minBits on, of a
// block aligned to its size inside [first, last]; -1 if none.
func largestAligned(first, last u128, width, minBits int) int {
	for bits := minBits; bits <= width; bits++ {
		m := hostMask(width, bits)
		cand, overflow := first.add(m)
		if overflow {
			continue
		}
		cand = cand.and(m.not())
		if end := cand.or(m); !last.less(end) && !end.less(cand) {
			return bits
		}
	}
	return -1
}

func count(first, last u128) float64 {
	n, _ := last.sub(first)
	return math.Ldexp(float64(n.hi), 64) + float64(n.lo) + 1
}

func maxU(a, b u128) u128 {
	if a.less(b) {
		return b
	}
	return a
}

func minU(a, b u128) u128 {
	if a.less(b) {
		return a
	}
	return b
}
