package discovery

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// The TXT strings of mDNS adverts come from anyone on the LAN.
func FuzzParseTXT(f *testing.F) {
	f.Add("txtvers=1\x00id=caaaaaaaaaaaaaaaaaaaaaaaaaa\x00fp=0011223344556677\x00v=1")
	f.Add("id=\x00fp=zz")
	f.Add(strings.Repeat("k=v\x00", 40))
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseTXT(strings.Split(s, "\x00"))
		if err != nil {
			return
		}
		for _, fp := range a.fingerprints {
			if len(fp) != 16 {
				t.Fatalf("accepted fingerprint %q", fp)
			}
		}
	})
}

// Join tokens come from operators and files; whatever parses must encode
// back to a token that parses to the same.
func FuzzParseJoinToken(f *testing.F) {
	key, _ := GenerateFederationKey()
	tok, _ := JoinToken{Key: key, Seeds: []string{"198.18.1.1:7946"}}.Encode()
	f.Add(tok)
	f.Add("flt1.")
	f.Add("flt1." + base64.RawURLEncoding.EncodeToString([]byte{32}))
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseJoinToken(s)
		if err != nil {
			return
		}
		again, err := got.Encode()
		if err != nil {
			t.Fatalf("parsed token does not encode: %v", err)
		}
		back, err := ParseJoinToken(again)
		if err != nil || !bytes.Equal(back.Key, got.Key) || !slices.Equal(back.Seeds, got.Seeds) {
			t.Fatalf("round trip changed the token: %+v -> %+v (%v)", got, back, err)
		}
	})
}

// The keyring is read back from the ledger.
func FuzzDecodeKeyring(f *testing.F) {
	key, _ := GenerateFederationKey()
	ring, _ := EncodeKeyring([][]byte{key})
	f.Add(ring)
	f.Add([]byte{})
	f.Add([]byte{255})
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := DecodeKeyring(b)
		if err != nil {
			return
		}
		again, err := EncodeKeyring(keys)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("keyring does not round-trip: %x -> %x (%v)", b, again, err)
		}
	})
}

// A token printed by accident (a log line, an error) does not reveal the key.
func TestJoinTokenDoesNotPrintItsKey(t *testing.T) {
	key, err := GenerateFederationKey()
	if err != nil {
		t.Fatal(err)
	}
	tok := JoinToken{Key: key, Seeds: []string{"198.18.1.1:7946"}}
	secret, err := tok.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, printed := range []string{fmt.Sprint(tok), fmt.Sprintf("%v %+v %s", tok, tok, tok), fmt.Errorf("joining with %v", tok).Error()} {
		for _, leak := range []string{secret, base64.StdEncoding.EncodeToString(key), base64.RawURLEncoding.EncodeToString(key), fmt.Sprintf("%x", key)} {
			if strings.Contains(printed, leak) {
				t.Fatalf("printed token %q contains the secret", printed)
			}
		}
	}
}

// NAT traversal packets come from anyone who can reach the gossip port.
// Whatever decodes was signed with the key and re-seals to the same bytes.
func FuzzDecodeNATPacket(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	keys := func() [][]byte { return [][]byte{testKey} }
	n := newNATTraversal(true, keys, func() time.Time { return now })
	n.setAdvertise(netip.MustParseAddrPort("10.1.0.2:7946"))
	f.Add(n.announcement(netip.MustParseAddrPort("198.18.0.3:7946"), true))
	req, _, cancel, err := n.expectDialBack()
	if err != nil {
		f.Fatal(err)
	}
	cancel()
	f.Add(req)
	f.Add([]byte{})
	f.Add(natMagic[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeNATPacket(b, keys(), now)
		if err != nil {
			return
		}
		var again []byte
		switch p.kind {
		case natAnnounce:
			m := newNATTraversal(true, keys, func() time.Time { return time.Unix(0, p.sent) })
			m.setAdvertise(p.advertise)
			again = m.announcement(p.advertise, true)
		case natDialBack:
			m := newNATTraversal(true, keys, func() time.Time { return time.Unix(0, p.sent) })
			again = m.sealNAT(natDialBack, p.nonce[:])
		default:
			t.Fatalf("accepted kind %d", p.kind)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("accepted %x, which re-seals as %x", b, again)
		}
	})
}
