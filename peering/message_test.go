package peering

import (
	"encoding/json"
	"errors"
	"net/netip"
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

func sampleHello(from, to identity.Identity) *Hello {
	return &Hello{
		From: from.ClusterID(), To: to.ClusterID(), Generation: 7,
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
		return reseal(withFields(t, sampleHello(a, b), nil), mallory)
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
		{"grant too large", func(h *Hello) { h.Grant = make([]byte, MaxGrantSize+1) }},
		{"too many networks", func(h *Hello) {
			h.Networks = nil
			for i := range MaxNetworks + 1 {
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

// A version outside the range this agent reads is refused, saying which
// side to upgrade, not "malformed".
func TestIncompatibleVersion(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	tests := []struct {
		version uint16
		says    string
	}{
		{ProtocolVersionMin - 1, "upgrade the sender's agent"},
		{ProtocolVersionMax + 1, "upgrade this agent"},
	}
	for _, tt := range tests {
		payload := withFields(t, sampleHello(a, b), map[string]any{"protocol": tt.version})
		_, err := Parse(reseal(payload, a))
		if !errors.Is(err, ErrIncompatible) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("Parse of version %d: %v, want ErrIncompatible saying %q", tt.version, err, tt.says)
		}
	}
}

// Versions within range are read, with the fields this version does not
// know ignored.
func TestNewerVersionWithinRange(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	payload := withFields(t, sampleHello(a, b), map[string]any{
		"protocol": ProtocolVersionMax, "protocolMax": ProtocolVersionMax + 1, "relays": []string{"198.18.7.7:51820"},
	})
	s, err := Parse(reseal(payload, a))
	if err != nil {
		t.Fatalf("Parse of version %d with a new field: %v", ProtocolVersionMax, err)
	}
	if err := s.Verify(a.Public()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if s.Hello.Protocol != ProtocolVersionMax || s.Hello.Name != "east" {
		t.Fatalf("read %+v", s.Hello)
	}
}

// A signature over the payload alone, as protocol 1 made them, does not
// verify: what is signed names its purpose, so a signature made for
// anything else can never pass for a statement.
func TestSignatureWithoutDomainIsRefused(t *testing.T) {
	a, b := mustIdentity(t), mustIdentity(t)
	payload := withFields(t, sampleHello(a, b), nil)
	msg := append(append([]byte{}, magic[:]...), byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload)))
	msg = append(append(msg, payload...), a.Sign(payload)...)
	s, err := Parse(msg)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if err := s.Verify(a.Public()); !errors.Is(err, ErrForged) {
		t.Fatalf("Verify of a signature without the domain: %v, want ErrForged", err)
	}
}

// withFields returns h as sealed by this agent, with fields set.
func withFields(t testing.TB, h *Hello, fields map[string]any) []byte {
	t.Helper()
	h.Protocol, h.ProtocolMin, h.ProtocolMax = ProtocolVersion, ProtocolVersionMin, ProtocolVersionMax
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		m[k] = v
	}
	b, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzParse(f *testing.F) {
	a, b := mustIdentity(f), mustIdentity(f)
	genuine, _ := Seal(sampleHello(a, b), a)
	f.Add(genuine)
	labelled := sampleHello(a, b)
	labelled.Labels = map[string]string{"region": "eu-west", "topology.example.com/zone": "a", "gpu": ""}
	withLabels, err := Seal(labelled, a)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(withLabels)
	f.Add(reseal(withFields(f, sampleHello(a, b), map[string]any{"protocol": ProtocolVersionMax, "relays": []string{"x"}}), a))
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

// reseal signs payload as a sender does, without checking it.
func reseal(payload []byte, id identity.Identity) []byte {
	out := append([]byte{}, magic[:]...)
	out = append(out, byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload)))
	out = append(out, payload...)
	return append(out, id.Sign(signed(payload))...)
}
