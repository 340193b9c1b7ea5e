package discovery

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
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
