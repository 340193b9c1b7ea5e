package discovery

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/identity"
)

func mustIdentity(t testing.TB) identity.Identity {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRecordRoundTrip(t *testing.T) {
	id := mustIdentity(t)
	for _, r := range []Record{
		{Protocol: 1, Serial: 1},
		{Protocol: 1, Serial: 42, Endpoint: "192.0.2.7:51820"},
		{Protocol: 7, Serial: 1 << 62, Endpoint: "[2001:db8::1]:51820", Leaving: true},
		{Protocol: 1, Serial: 3, Endpoint: "gw." + strings.Repeat("a", MaxEndpointLen-9) + ":1"},
		{Protocol: 1, Serial: 4, OutboundOnly: true},
		{Protocol: 1, Serial: 5, OutboundOnly: true, Leaving: true},
	} {
		b, err := SignRecord(id, r)
		if err != nil {
			t.Fatalf("sign %+v: %v", r, err)
		}
		if len(b) > metaSizeLimit-100 {
			t.Errorf("record of %d bytes leaves less than 100 bytes of memberlist's %d", len(b), metaSizeLimit)
		}
		got, err := DecodeRecord(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		want := r
		want.ClusterID, want.PublicKey = id.ClusterID(), id.Public()
		if got.ClusterID != want.ClusterID || !bytes.Equal(got.PublicKey, want.PublicKey) ||
			got.Endpoint != want.Endpoint || got.Protocol != want.Protocol || got.Serial != want.Serial || got.Leaving != want.Leaving ||
			got.OutboundOnly != want.OutboundOnly {
			t.Errorf("decoded %+v, want %+v", got, want)
		}
	}
}

func TestSignRecordRefusesBadEndpoint(t *testing.T) {
	id := mustIdentity(t)
	for _, ep := range []string{"no-port", "a b:1", strings.Repeat("a", MaxEndpointLen) + ":1", ":51820", "h:"} {
		if _, err := SignRecord(id, Record{Protocol: 1, Endpoint: ep}); err == nil {
			t.Errorf("endpoint %q accepted", ep)
		}
	}
}

func TestDecodeRecordRefusals(t *testing.T) {
	id, other := mustIdentity(t), mustIdentity(t)
	good, err := SignRecord(id, Record{Protocol: 1, Serial: 9, Endpoint: "192.0.2.1:51820"})
	if err != nil {
		t.Fatal(err)
	}
	// The key follows the header; the endpoint length follows the key.
	keyAt := headerLen
	withKey := func(pub []byte) []byte {
		b := bytes.Clone(good)
		copy(b[keyAt:], pub)
		return b
	}
	resigned := func(mut func([]byte)) []byte {
		body := bytes.Clone(good[:len(good)-recordSigLen])
		mut(body)
		return append(body, id.Sign(signedBytes(body))...)
	}
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x01
		return b
	}
	tests := []struct {
		name   string
		in     []byte
		reason string
	}{
		{"empty", nil, ReasonMalformed},
		{"short", good[:40], ReasonMalformed},
		{"oversized", append(bytes.Clone(good), make([]byte, MaxRecordLen)...), ReasonOversized},
		{"bad magic", flip(0), ReasonMalformed},
		{"future format", func() []byte { b := bytes.Clone(good); b[1] = 9; return b }(), ReasonFormat},
		{"unknown flag", resigned(func(b []byte) { b[4] = 0x80 }), ReasonMalformed},
		{"unknown flag beside outbound only", resigned(func(b []byte) { b[4] = flagOutbound | 0x04 }), ReasonMalformed},
		// A member cannot be made to look reachable, or not, by anyone
		// but itself: the flag is under the signature.
		{"outbound only set by another", func() []byte { b := bytes.Clone(good); b[4] |= flagOutbound; return b }(), ReasonBadSignature},
		{"tampered serial", flip(12), ReasonBadSignature},
		{"tampered endpoint", flip(len(good) - recordSigLen - 1), ReasonBadSignature},
		{"tampered signature", flip(len(good) - 1), ReasonBadSignature},
		{"another key swapped in", withKey(other.Public()), ReasonBadSignature},
		{"format 1", func() []byte { b := bytes.Clone(good); b[1] = 1; return b }(), ReasonFormat},
		{"endpoint length lies", resigned(func(b []byte) { b[keyAt+recordKeyLen]++ }), ReasonMalformed},
		{"protocol zero", resigned(func(b []byte) { binary.BigEndian.PutUint16(b[2:], 0) }), ReasonProtocol},
		{"signed by another identity", func() []byte {
			body := bytes.Clone(good[:len(good)-recordSigLen])
			return append(body, other.Sign(signedBytes(body))...)
		}(), ReasonBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRecord(tt.in)
			if err == nil {
				t.Fatal("accepted")
			}
			if got := ReasonOf(err); got != tt.reason {
				t.Errorf("reason %q (%v), want %q", got, err, tt.reason)
			}
		})
	}
}

func FuzzDecodeRecord(f *testing.F) {
	id, err := identity.FromSeed(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range []Record{
		{Protocol: 1, Serial: 1},
		{Protocol: 1, Serial: 2, Endpoint: "10.0.0.1:51820", Leaving: true},
		{Protocol: 1, Serial: 3, OutboundOnly: true},
	} {
		b, err := SignRecord(id, r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte("F\x02"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			var re *RecordError
			if !asRecordError(err, &re) {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		// Whatever decodes must be self-consistent and re-encode to the
		// same bytes.
		if identity.ClusterID(r.PublicKey) != r.ClusterID {
			t.Fatalf("accepted a record whose ID is not its key's")
		}
		body, err := r.marshalBody()
		if err != nil {
			t.Fatalf("decoded record does not re-encode: %v", err)
		}
		if !bytes.Equal(body, b[:len(b)-recordSigLen]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func asRecordError(err error, re **RecordError) bool {
	e, ok := err.(*RecordError)
	*re = e
	return ok && e.Reason != ""
}

func TestJoinToken(t *testing.T) {
	key := bytes.Repeat([]byte{0xab}, 32)
	tok := JoinToken{Key: key, Seeds: []string{"192.0.2.1:7946", "[2001:db8::1]:7946", "gw.example.org:7946"}}
	s, err := tok.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s, "flt1.") || strings.ContainsAny(s, " +/=") {
		t.Errorf("token %q is not URL- and shell-safe", s)
	}
	got, err := ParseJoinToken(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Key, key) || strings.Join(got.Seeds, ",") != strings.Join(tok.Seeds, ",") {
		t.Errorf("round trip: %+v, want %+v", got, tok)
	}
	viaKeyFlag, err := ParseFederationKey(s)
	if err != nil || !bytes.Equal(viaKeyFlag.Key, key) {
		t.Errorf("--federation-key with a token: %v", err)
	}

	bad := []struct{ name, in string }{
		{"no prefix", s[5:]},
		{"cut short", s[:len(s)-3]},
		{"one character changed", s[:10] + string(rune(s[10])^1) + s[11:]},
		{"not base64", "flt1.***"},
		{"empty", "flt1."},
	}
	for _, b := range bad {
		if _, err := ParseJoinToken(b.in); err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if _, err := (JoinToken{Key: []byte("short")}).Encode(); err == nil {
		t.Error("a 5-byte key was encoded")
	}
	if _, err := (JoinToken{Key: key, Seeds: []string{"no-port"}}).Encode(); err == nil {
		t.Error("a seed without port was encoded")
	}
}

func TestParseFederationKeyBase64(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	for _, in := range []string{
		"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
		"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE\n",
	} {
		got, err := ParseFederationKey(in)
		if err != nil || !bytes.Equal(got.Key, key) {
			t.Errorf("%q: %v", in, err)
		}
	}
	if _, err := ParseFederationKey("AQID"); err == nil {
		t.Error("3-byte key accepted")
	}
}

func TestFingerprint(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	if Fingerprint(k1) != Fingerprint(bytes.Clone(k1)) {
		t.Error("fingerprint not stable")
	}
	if Fingerprint(k1) == Fingerprint(k2) {
		t.Error("two keys share a fingerprint")
	}
	if fp := Fingerprint(k1); len(fp) != 16 || strings.Contains(fp, "0101") {
		t.Errorf("fingerprint %q: want 16 hex digits unrelated to the key bytes", fp)
	}
}

func TestKeyringEncoding(t *testing.T) {
	keys := [][]byte{bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16)}
	b, err := EncodeKeyring(keys)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeKeyring(b)
	if err != nil || len(got) != 2 || !bytes.Equal(got[0], keys[0]) || !bytes.Equal(got[1], keys[1]) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for _, bad := range [][]byte{nil, {32, 1, 2}, {3, 1, 2, 3}} {
		if _, err := DecodeKeyring(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestParseTXT(t *testing.T) {
	id := mustIdentity(t).ClusterID()
	fp := Fingerprint(bytes.Repeat([]byte{1}, 32))
	tests := []struct {
		name   string
		fields []string
		ok     bool
	}{
		{"complete", []string{"txtvers=1", "id=" + id, "fp=" + fp, "v=1"}, true},
		{"two fingerprints, upper-case key", []string{"ID=" + id, "fp=" + fp + "," + fp}, true},
		{"first occurrence wins", []string{"id=" + id, "id=junk", "fp=" + fp}, true},
		{"unknown keys ignored", []string{"id=" + id, "fp=" + fp, "color=blue", "novalue"}, true},
		{"no id", []string{"fp=" + fp}, false},
		{"bad id", []string{"id=cXYZ", "fp=" + fp}, false},
		{"no fingerprint", []string{"id=" + id}, false},
		{"fingerprint not hex", []string{"id=" + id, "fp=zzzzzzzzzzzzzzzz"}, false},
		{"fingerprint too long", []string{"id=" + id, "fp=" + fp + "00"}, false},
		{"bad protocol", []string{"id=" + id, "fp=" + fp, "v=-1"}, false},
		{"oversized string", []string{"id=" + id, "fp=" + fp, strings.Repeat("x", 300)}, false},
		{"too many strings", append([]string{"id=" + id, "fp=" + fp}, make([]string, 40)...), false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := parseTXT(tt.fields)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if tt.ok && a.clusterID != id {
				t.Errorf("cluster ID %q", a.clusterID)
			}
		})
	}
}
