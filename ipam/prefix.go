package ipam

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
)

// ErrInvalidRange and ErrInvalidPeer are wrapped by every error about a
// malformed range or peer ID.
var (
	ErrInvalidRange = errors.New("invalid range")
	ErrInvalidPeer  = errors.New("invalid peer ID")
)

// CheckRange reports why p cannot be used as a network range: it must be
// valid, canonical (no host bits set), not an IPv4-mapped IPv6 range, carry
// no zone, and be narrower than the whole address space.
func CheckRange(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("%w: %q is not a valid prefix", ErrInvalidRange, p.String())
	case p.Addr().Zone() != "":
		return fmt.Errorf("%w: %s has a zone", ErrInvalidRange, p)
	case p.Addr().Is4In6():
		return fmt.Errorf("%w: %s is an IPv4-mapped IPv6 range; write it as IPv4", ErrInvalidRange, p)
	case p.Masked() != p:
		return fmt.Errorf("%w: %s has host bits set; the network is %s", ErrInvalidRange, p, p.Masked())
	case p.Bits() == 0:
		return fmt.Errorf("%w: %s covers the whole address space", ErrInvalidRange, p)
	}
	return nil
}

// CheckIPv4Range reports why p, named what in the error, cannot be a
// range the fabric routes: valid, IPv4, canonical, not everything.
func CheckIPv4Range(what string, p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("%s %q: not a valid prefix", what, p)
	case !p.Addr().Is4():
		return fmt.Errorf("%s %s: not IPv4; the fabric routes IPv4 only", what, p)
	case p != p.Masked():
		return fmt.Errorf("%s %s is not canonical: did you mean %s?", what, p, p.Masked())
	case p.Bits() == 0:
		return fmt.Errorf("%s %s would take every destination; want a range", what, p)
	}
	return nil
}

// ParseRange parses and checks a range such as "10.244.0.0/16".
func ParseRange(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%w: %v", ErrInvalidRange, err)
	}
	if err := CheckRange(p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// u128 is an address as a 128-bit number; IPv4 addresses use lo only.
type u128 struct{ hi, lo uint64 }

func addrNum(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	return u128{hi: be64(b[:8]), lo: be64(b[8:])}
}

func be64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

func numAddr(n u128, v4 bool) netip.Addr {
	if v4 {
		x := uint32(n.lo)
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(n.hi >> (56 - 8*i))
		b[8+i] = byte(n.lo >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}

func (a u128) less(b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }
func (a u128) and(b u128) u128  { return u128{a.hi & b.hi, a.lo & b.lo} }
func (a u128) or(b u128) u128   { return u128{a.hi | b.hi, a.lo | b.lo} }
func (a u128) not() u128        { return u128{^a.hi, ^a.lo} }

// add returns a+b and whether it overflowed 128 bits.
func (a u128) add(b u128) (u128, bool) {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, c := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}, c != 0
}

// sub returns a-b and whether it borrowed (b > a).
func (a u128) sub(b u128) (u128, bool) {
	lo, c := bits.Sub64(a.lo, b.lo, 0)
	hi, c := bits.Sub64(a.hi, b.hi, c)
	return u128{hi, lo}, c != 0
}

// shift returns the address at a's offset from "from", counted from "to"
// (all of one family), and false when that falls outside the family.
func shift(a, from, to netip.Addr) (netip.Addr, bool) {
	var n u128
	var out bool
	if d, neg := addrNum(a).sub(addrNum(from)); !neg {
		n, out = addrNum(to).add(d)
	} else {
		d, _ = addrNum(from).sub(addrNum(a))
		n, out = addrNum(to).sub(d)
	}
	if out || a.Is4() && (n.hi != 0 || n.lo > 0xffffffff) {
		return netip.Addr{}, false
	}
	return numAddr(n, a.Is4()), true
}

// hostMask is the mask of the host bits of a prefix of the given length in
// a family of width bits (32 or 128).
func hostMask(width, prefixBits int) u128 {
	n := width - prefixBits // number of host bits
	switch {
	case n <= 0:
		return u128{}
	case n >= 128:
		return u128{^uint64(0), ^uint64(0)}
	case n >= 64:
		return u128{hi: 1<<(n-64) - 1, lo: ^uint64(0)}
	default:
		return u128{lo: 1<<n - 1}
	}
}

// span is a range as [first, last] numbers, used for overlap tests and the
// free-block search.
type span struct{ first, last u128 }

func spanOf(p netip.Prefix) span {
	first := addrNum(p.Addr())
	return span{first, first.or(hostMask(p.Addr().BitLen(), p.Bits()))}
}

func (s span) overlaps(t span) bool { return !s.last.less(t.first) && !t.last.less(s.first) }

// overlaps reports whether two ranges of the same family share an address.
func overlaps(a, b netip.Prefix) bool {
	return a.Addr().Is4() == b.Addr().Is4() && a.Overlaps(b)
}

// aligned reports whether p starts on a multiple of its own size, which
// every canonical prefix does; kept as a named check for the invariants.
func aligned(p netip.Prefix) bool {
	return addrNum(p.Addr()).and(hostMask(p.Addr().BitLen(), p.Bits())) == u128{}
}

// translate maps ip, which lies in a range as long as to and of its family,
// to the address at the same offset in to.
func translate(ip netip.Addr, to netip.Prefix) netip.Addr {
	width := ip.BitLen()
	m := hostMask(width, to.Bits())
	n := addrNum(to.Addr()).and(m.not()).or(addrNum(ip).and(m))
	return numAddr(n, width == 32)
}

func family(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}
