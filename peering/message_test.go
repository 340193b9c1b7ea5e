package peering

import (
	"encoding/json"
	"errors"
	"net/netip"
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

func sampleHello(from, to identity.Identity) *Hello {
	return &Hello{
		Protocol: ProtocolVersion, From: from.ClusterID(), To: to.ClusterID(), Generation: 7,
		Name: "east", Networks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
		WireGuardKey: make([]byte, 32), Endpoint: netip.MustParseAddrPort("198.18.1.1:51820"),
		Decision:   Accept,
		ViewsOfYou: []ViewClaim{{Range: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("100.96.0.0/16")}},
	}
}

func TestSealParseVerify(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	msg, err := Seal(sampleHello(a, b), a)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse(msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(a.Public()); err != nil {
		t.Fatalf("genuine message refused: %v", err)
	}
	if s.Hello.Name != "east" || s.Hello.ViewsOfYou[0].As.String() != "100.96.0.0/16" {
		t.Fatalf("round trip changed the hello: %+v", s.Hello)
	}
}

func TestRefusals(t *testing.T) {
	a, b, mallory := mustIdentity(t), mustIdentity(t), mustIdentity(t)
	genuine, _ := Seal(sampleHello(a, b), a)
	tampered := append([]byte{}, genuine...)
	tampered[len(tampered)-signatureSize-3] ^= 1 // inside the JSON payload
	// Mallory writes a hello claiming to come from a and signs it with her
	// own key; the receiver checks it against a's key.
	forged := func() []byte {
		payload, err := json.Marshal(sampleHello(a, b))
		if err != nil {
			t.Fatal(err)
		}
		return reseal(payload, mallory)
	}()
	tests := []struct {
		name   string
		msg    []byte
		key    []byte
		parse  error
		verify error
	}{
		{"empty", nil, nil, ErrMalformed, nil},
		{"garbage", []byte("hello world, this is not a flotilla message at all, not at all, no. no. no. no. no."), nil, ErrMalformed, nil},
		{"truncated", genuine[:len(genuine)-1], nil, ErrMalformed, nil},
		{"tampered payload", tampered, a.Public(), nil, ErrForged},
		{"verified with another cluster's key", genuine, b.Public(), nil, ErrForged},
		{"claims to be a, signed by mallory", forged, a.Public(), nil, ErrForged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.msg)
			if tt.parse != nil {
				if !errors.Is(err, tt.parse) {
					t.Fatalf("Parse: %v, want %v", err, tt.parse)
				}
				return
			}
			if err != nil {
				// A tampered payload may no longer be valid JSON: also a refusal.
				if tt.verify == ErrForged && errors.Is(err, ErrMalformed) {
					return
				}
				t.Fatalf("Parse: %v", err)
			}
			if err := s.Verify(tt.key); !errors.Is(err, tt.verify) {
				t.Fatalf("Verify: %v, want %v", err, tt.verify)
			}
		})
	}
}

func TestInvalidHellos(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	tests := []struct {
		name   string
		mutate func(h *Hello)
	}{
		{"other protocol", func(h *Hello) { h.Protocol = 2 }},
		{"generation 0", func(h *Hello) { h.Generation = 0 }},
		{"to itself", func(h *Hello) { h.To = h.From }},
		{"short key", func(h *Hello) { h.WireGuardKey = h.WireGuardKey[:16] }},
		{"no endpoint", func(h *Hello) { h.Endpoint = netip.AddrPort{} }},
		{"unknown decision", func(h *Hello) { h.Decision = "maybe" }},
		{"non-canonical network", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/16")} }},
		{"overlapping networks", func(h *Hello) {
			h.Networks = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.0.1.0/24")}
		}},
		{"view of another size", func(h *Hello) {
			h.ViewsOfYou = []ViewClaim{{Range: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("100.96.0.0/24")}}
		}},
		{"views while pending", func(h *Hello) { h.Decision = Pending }},
		{"IPv6 network", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("fd00::/64")} }},
		{"wider than /8", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/1")} }},
		{"public range", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("8.8.8.0/24")} }},
		{"straddles private space", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("172.0.0.0/8")} }},
		{"wide /4", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("16.0.0.0/4")} }},
		{"loopback", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} }},
		{"link-local", func(h *Hello) { h.Networks = []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")} }},
		{"multicast view", func(h *Hello) {
			h.ViewsOfYou = []ViewClaim{{Range: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("224.1.0.0/16")}}
		}},
		{"too many networks", func(h *Hello) {
			h.Networks = nil
			for i := range maxNetworks + 1 {
				h.Networks = append(h.Networks, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := sampleHello(a, b)
			tt.mutate(h)
			if _, err := Seal(h, a); err == nil {
				t.Fatal("Seal accepted an invalid hello")
			}
		})
	}
	if _, err := Seal(sampleHello(a, b), b); err == nil {
		t.Fatal("Seal signed a hello from a with b's identity")
	}
}

// An incompatible peer gets a refusal that says so, not "malformed".
func TestIncompatibleVersion(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	msg, _ := Seal(sampleHello(a, b), a)
	s, _ := Parse(msg)
	payload := []byte(string(s.Payload()))
	i := indexOf(payload, `"protocol":1`)
	payload[i+len(`"protocol":`)] = '9'
	_, err := Parse(reseal(payload, a))
	if !errors.Is(err, ErrIncompatible) {
		t.Fatalf("Parse of protocol 9: %v, want ErrIncompatible", err)
	}
}

func FuzzParse(f *testing.F) {
	a, b := mustIdentity(f), mustIdentity(f)
	genuine, _ := Seal(sampleHello(a, b), a)
	f.Add(genuine)
	f.Add([]byte{})
	f.Add(append(magic[:], 0, 0, 0, 2, '{', '}'))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b)
		if err != nil {
			return
		}
		// Whatever parses must be valid and re-sealable by its sender.
		if err := s.Hello.validate(); err != nil {
			t.Fatalf("Parse accepted an invalid hello: %v", err)
		}
		s.Verify(a.Public())
	})
}

func indexOf(b []byte, s string) int {
	for i := 0; i+len(s) <= len(b); i++ {
		if string(b[i:i+len(s)]) == s {
			return i
		}
	}
	return -1
}

func reseal(payload []byte, id identity.Identity) []byte {
	out := append([]byte{}, magic[:]...)
	out = append(out, byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload)))
	out = append(out, payload...)
	return append(out, id.Sign(payload)...)
}

func jsonMarshal(h *Hello) ([]byte, error) { return json.Marshal(h) }
