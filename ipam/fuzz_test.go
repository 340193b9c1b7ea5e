package ipam

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// FuzzClaims feeds arbitrary peers, ranges and claims to a ledger. Every
// input is either accepted with the ledger's invariants intact or refused
// with one of the documented errors.
func FuzzClaims(f *testing.F) {
	seeds := [][4]string{
		{"c1", "10.0.0.0/16", "10.0.0.0/16", "10.70.0.0/16"},
		{"c1", "10.0.0.1/16", "10.0.0.0/16", "10.70.0.0/24"},
		{"c2", "fd00:10::/56", "fd00:10::/56", "fd00:99::/56"},
		{"c3", "0.0.0.0/0", "10.96.0.0/12", "fd00::/12"},
		{"", "::ffff:10.0.0.0/104", "10.0.0.0/8", "10.0.0.0/8"},
		{"a b", "100.96.0.0/16", "10.0.1.0/24", "100.96.0.0/24"},
		{"c4", "10.0.0.0/32", "fe80::1%eth0/64", "10.0.0.0/33"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3])
	}
	l, _ := openTest(f, Options{Quarantine: -1, noSync: true, Pools: []netip.Prefix{pfx("100.96.0.0/14"), pfx("fddc:467:9000::/40")}})
	setLocals(f, l, testLocals)
	f.Fuzz(func(t *testing.T, peer, remote, mine, theirs string) {
		known := func(err error) bool {
			return errors.Is(err, ErrInvalidRange) || errors.Is(err, ErrInvalidPeer) ||
				errors.Is(err, ErrExhausted) || errors.Is(err, ErrInconsistentClaim)
		}
		parse := func(s string) (netip.Prefix, bool) {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				if _, err := ParseRange(s); !errors.Is(err, ErrInvalidRange) {
					t.Fatalf("ParseRange(%q) = %v, want ErrInvalidRange", s, err)
				}
				return p, false
			}
			return p, true
		}
		if r, ok := parse(remote); ok {
			v, err := l.ViewOf(peer, r)
			switch {
			case err != nil && !known(err):
				t.Fatalf("ViewOf(%q, %s): undocumented error %v", peer, r, err)
			case err == nil:
				if v.Bits() != r.Bits() || v.Addr().Is4() != r.Addr().Is4() {
					t.Fatalf("ViewOf(%q, %s) = %s: not the same size", peer, r, v)
				}
				last := numAddr(spanOf(r).last, r.Addr().Is4()) // the last address, host bits all set
				got, ok := l.ToLocal(peer, last)
				if !ok || !v.Contains(got) {
					t.Fatalf("ToLocal(%q, %s) = %s %v, want inside %s", peer, last, got, ok, v)
				}
				if back, ok := l.ToRemote(peer, got); !ok || back != last {
					t.Fatalf("ToRemote(%q, %s) = %s %v, want %s", peer, got, back, ok, last)
				}
			}
		}
		m, ok1 := parse(mine)
		th, ok2 := parse(theirs)
		if ok1 && ok2 {
			err := l.RecordTheirView(peer, m, th)
			if err != nil && !known(err) {
				t.Fatalf("RecordTheirView(%q, %s, %s): undocumented error %v", peer, m, th, err)
			}
			if err == nil && (m.Bits() != th.Bits() || m.Addr().Is4() != th.Addr().Is4()) {
				t.Fatalf("RecordTheirView accepted %s as %s", m, th)
			}
		}
		if err := checkInvariants(l); err != nil {
			t.Fatal(err)
		}
		if CheckPeer(peer) == nil {
			if err := l.ReleasePeer(peer); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzRecord checks the decoder of stored keys: no panic, and whatever
// decodes re-encodes to the same bytes.
func FuzzRecord(f *testing.F) {
	f.Add(peerRangeKey("c1", pfx("10.0.0.0/16")))
	f.Add(peerRangeKey("c1", pfx("fd00::/48")))
	f.Add([]byte("p\x00\x04junk"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := readPeerRangeKey(b)
		if err != nil {
			return
		}
		if again := peerRangeKey(k.peer, k.r); !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %s %s, which encodes to %x", b, k.peer, k.r, again)
		}
	})
}
