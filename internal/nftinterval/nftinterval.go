// Package nftinterval renders IPv4 prefixes as the elements of an
// nftables interval set or verdict map, and reads the kernel's dump of
// such a set back into intervals.
//
// The kernel holds an interval as two elements: its start (carrying the
// verdict, in a map) and the first address after it, flagged as an end.
// An interval reaching 255.255.255.255 has no end element.
package nftinterval

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// Interval is one entry of an interval set as the kernel holds it.
type Interval struct {
	Start, End [4]byte
	Open       bool // no end element: the interval reaches 255.255.255.255
}

// Of returns the interval of the IPv4 prefix p.
func Of(p netip.Prefix) Interval {
	iv := Interval{Start: p.Addr().As4()}
	if next := last(p).Next(); next.IsValid() {
		iv.End = next.As4()
	} else {
		iv.Open = true
	}
	return iv
}

// Elements are the interval's kernel elements, the start first. Elements
// go in and out in start, end pairs: the kernel refuses an end that lands
// on the start of an interval already inserted in the same transaction,
// which adjacent prefixes would otherwise produce.
func (iv Interval) Elements() []nftables.SetElement {
	start := nftables.SetElement{Key: slices.Clone(iv.Start[:])}
	if iv.Open {
		return []nftables.SetElement{start}
	}
	return []nftables.SetElement{start, {Key: slices.Clone(iv.End[:]), IntervalEnd: true}}
}

// ElementsOf are the elements of ivs, in order.
func ElementsOf(ivs []Interval) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(ivs))
	for _, iv := range ivs {
		out = append(out, iv.Elements()...)
	}
	return out
}

// Dumped is an interval read back from the kernel, with its start element
// as dumped: a verdict map's verdict is in the start element's Val.
type Dumped struct {
	Interval
	StartElement nftables.SetElement
}

// Parse pairs the elements of an interval set, as the kernel dumps them
// (in any order), into intervals. An end element with no start before it
// is stray: returned as a key to delete. Elements whose key is not an IPv4
// address are not of an IPv4 interval set and are passed over.
func Parse(elems []nftables.SetElement) (ivs []Dumped, stray []nftables.SetElement) {
	elems = slices.Clone(elems)
	slices.SortFunc(elems, func(a, b nftables.SetElement) int {
		if c := slices.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		// The end of one interval comes before the start of the next.
		switch {
		case a.IntervalEnd && !b.IntervalEnd:
			return -1
		case !a.IntervalEnd && b.IntervalEnd:
			return 1
		}
		return 0
	})
	var cur *Dumped
	for _, e := range elems {
		if len(e.Key) != 4 {
			continue
		}
		if e.IntervalEnd {
			if cur == nil {
				stray = append(stray, nftables.SetElement{Key: e.Key, IntervalEnd: true})
				continue
			}
			cur.End = [4]byte(e.Key)
			ivs = append(ivs, *cur)
			cur = nil
			continue
		}
		if cur != nil {
			cur.Open = true
			ivs = append(ivs, *cur)
		}
		cur = &Dumped{Interval: Interval{Start: [4]byte(e.Key)}, StartElement: e}
	}
	if cur != nil {
		cur.Open = true
		ivs = append(ivs, *cur)
	}
	return ivs, stray
}

// elementBatch bounds the elements per netlink message: the element list
// is one attribute, whose length field has 16 bits.
const elementBatch = 512

// Change queues on c the deletion of del and then the addition of add to
// the set or map s, in messages small enough for netlink.
func Change(c *nftables.Conn, s *nftables.Set, del, add []nftables.SetElement) error {
	kind := "set"
	if s.IsMap {
		kind = "map"
	}
	for len(del) > 0 {
		k := min(len(del), elementBatch)
		if err := c.SetDeleteElements(s, del[:k]); err != nil {
			return fmt.Errorf("delete elements of %s %s: %w", kind, s.Name, err)
		}
		del = del[k:]
	}
	for len(add) > 0 {
		k := min(len(add), elementBatch)
		if err := c.SetAddElements(s, add[:k]); err != nil {
			return fmt.Errorf("add elements to %s %s: %w", kind, s.Name, err)
		}
		add = add[k:]
	}
	return nil
}

// last is the last address of the IPv4 prefix p.
func last(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(a)
}

// Prefix is the prefix the interval covers, when it covers exactly one.
func (iv Interval) Prefix() (netip.Prefix, bool) {
	start := netip.AddrFrom4(iv.Start)
	for bits := 0; bits <= 32; bits++ {
		p := netip.PrefixFrom(start, bits)
		if p.Masked() == p && Of(p) == iv {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
