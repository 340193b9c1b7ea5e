package grant

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// A grant sealed by its provider opens for its consumer as it was, token
// and all; so does a revocation.
func TestSealOpen(t *testing.T) {
	p, c := newID(t), newID(t)
	for _, g := range []Grant{sample(t, p, c, 7), revocation(p, c, 8)} {
		got, err := Open(c, p.Public(), mustSeal(t, p, c.Public(), g))
		if err != nil {
			t.Fatalf("Open: %s", safe(err))
		}
		if !got.Token.Equal(g.Token) {
			t.Fatalf("token of %d bytes opened as %d bytes", g.Token.Len(), got.Token.Len())
		}
		g.Version, got.Token, g.Token = Version, Token{}, Token{}
		if got.Provider != g.Provider || got.Consumer != g.Consumer || got.Serial != g.Serial || got.Revoked != g.Revoked ||
			!got.IssuedAt.Equal(g.IssuedAt) || !got.ExpiresAt.Equal(g.ExpiresAt) || got.Server != g.Server ||
			!bytes.Equal(got.CAData, g.CAData) || got.Namespace != g.Namespace || got.Limits != g.Limits || got.Version != Version {
			t.Fatalf("opened %+v, sealed %+v", got, g)
		}
	}
}

// What did not come from the provider to this consumer, sealed for a
// grant, is refused with an error that says which.
func TestOpenRefusesWhatIsNotOurs(t *testing.T) {
	p, c, other, mallory := newID(t), newID(t), newID(t), newID(t)
	genuine := mustSeal(t, p, c.Public(), sample(t, p, c, 1))
	tampered := slices.Clone(genuine)
	tampered[len(tampered)/2] ^= 1
	// Mallory seals a grant naming p as its provider with her own key.
	claims := wireFields(t, sample(t, p, c, 1))
	forged := sealWire(t, mallory, c.Public(), claims)
	// p seals, to c, a grant naming another consumer or another provider.
	forOther := wireFields(t, sample(t, p, c, 1))
	forOther["consumer"] = other.ClusterID()
	namesOther := wireFields(t, sample(t, p, c, 1))
	namesOther["provider"] = other.ClusterID()
	otherPurpose, err := p.SealFor(c.Public(), "flotilla.io/something-else", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		sealed   []byte
		provider []byte
		want     error
		says     string
	}{
		{"sealed to another cluster", mustSeal(t, p, other.Public(), sample(t, p, other, 1)), p.Public(), ErrNotForUs, "another cluster"},
		{"names another consumer", sealWire(t, p, c.Public(), forOther), p.Public(), ErrNotForUs, "grant for another cluster"},
		{"sealed by mallory, claims p", forged, p.Public(), ErrForged, "not sealed by"},
		{"opened as from mallory, names p", forged, mallory.Public(), ErrForged, "names " + p.ClusterID()},
		{"names another provider", sealWire(t, p, c.Public(), namesOther), p.Public(), ErrForged, "names " + other.ClusterID()},
		{"genuine, checked against another key", genuine, other.Public(), ErrForged, "not sealed by"},
		{"sealed for another purpose", otherPurpose, p.Public(), ErrForged, "purpose"},
		{"tampered", tampered, p.Public(), ErrNotForUs, "damaged"},
		{"truncated", genuine[:40], p.Public(), ErrMalformed, "bytes"},
		{"too large", make([]byte, MaxSealedSize+1), p.Public(), ErrMalformed, "over"},
		{"bad provider key", genuine, []byte{1, 2}, ErrMalformed, "provider key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(c, tt.provider, tt.sealed)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Open = %s; want %v saying %q", safe(err), tt.want, tt.says)
			}
			safe(err)
			noToken(t, "error", err.Error())
		})
	}
}

// Every malformed grant is refused by Seal on the provider and, sealed by
// other code, by Open on the consumer (ErrMalformed); neither error
// quotes the token.
func TestMalformedGrants(t *testing.T) {
	p, c := newID(t), newID(t)
	ca := testCA(t)
	key := []byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIE1hbGxvcnkgd2FzIGhlcmUgYW5kIGxlZnQgYSBrZXk=\n-----END PRIVATE KEY-----\n")
	tests := []struct {
		name   string
		change func(g *Grant)
		says   string
	}{
		{"version 2", func(g *Grant) { g.Version = 2 }, "upgrade"},
		{"serial 0", func(g *Grant) { g.Serial = 0 }, "serial 0"},
		{"bad consumer ID", func(g *Grant) { g.Consumer = "C" + g.Consumer[1:] }, "consumer"},
		{"provider is consumer", func(g *Grant) { g.Consumer = g.Provider }, "same cluster"},
		{"no issue time", func(g *Grant) { g.IssuedAt = time.Time{} }, "issued"},
		{"expires before issued", func(g *Grant) { g.ExpiresAt = g.IssuedAt }, "issued"},
		{"no server", func(g *Grant) { g.Server = "" }, "no API server"},
		{"http server", func(g *Grant) { g.Server = "http://198.18.0.10:6443" }, "https"},
		{"server without host", func(g *Grant) { g.Server = "https:///api" }, "host"},
		{"server with credentials", func(g *Grant) { g.Server = "https://admin:hunter2@198.18.0.10" }, "credentials"},
		{"server with a query", func(g *Grant) { g.Server = "https://198.18.0.10/?token=x" }, "path only"},
		{"server not a URL", func(g *Grant) { g.Server = "https://[::1" }, "URL"},
		{"long server", func(g *Grant) { g.Server = "https://h/" + strings.Repeat("a", MaxServerLength) }, "over"},
		{"no CA", func(g *Grant) { g.CAData = nil }, "no CA"},
		{"CA not PEM", func(g *Grant) { g.CAData = []byte("hello") }, "no PEM certificate"},
		{"CA with a private key", func(g *Grant) { g.CAData = append(ca, key...) }, "CERTIFICATE blocks only"},
		{"CA not a certificate", func(g *Grant) {
			g.CAData = []byte("-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n")
		}, "certificate 1"},
		{"CA with a broken second block", func(g *Grant) {
			g.CAData = append(ca, []byte("-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n")...)
		}, "block 2"},
		{"CA not text", func(g *Grant) { g.CAData = append(ca, 0xff) }, "ASCII"},
		{"CA too large", func(g *Grant) { g.CAData = bytes.Repeat(ca, MaxCASize/len(ca)+1) }, "over"},
		{"no token", func(g *Grant) { g.Token = Token{} }, "no token"},
		{"token with a space", func(g *Grant) { g.Token = NewToken(secret[:30] + " " + secret[30:]) }, "byte 30"},
		{"token with a newline", func(g *Grant) { g.Token = NewToken(secret + "\n") }, "whitespace"},
		{"token not ASCII", func(g *Grant) { g.Token = NewToken(secret + "é") }, "printable"},
		{"token too large", func(g *Grant) { g.Token = NewToken(strings.Repeat(secret, MaxTokenSize/len(secret)+1)) }, "over"},
		{"no namespace", func(g *Grant) { g.Namespace = "" }, "namespace"},
		{"namespace not a label", func(g *Grant) { g.Namespace = "Tenant.x" }, "namespace"},
		{"namespace ends with a dash", func(g *Grant) { g.Namespace = "tenant-" }, "namespace"},
		{"namespace too long", func(g *Grant) { g.Namespace = strings.Repeat("a", 64) }, "namespace"},
		{"negative pods", func(g *Grant) { g.Limits.Pods = -1 }, "pods"},
		{"negative namespaces", func(g *Grant) { g.Limits.Namespaces = -3 }, "namespaces"},
		{"cpu not a quantity", func(g *Grant) { g.Limits.CPU = "four" }, "cpu"},
		{"negative memory", func(g *Grant) { g.Limits.Memory = "-1Gi" }, "memory"},
		{"revocation with a token", func(g *Grant) {
			*g = Grant{Provider: g.Provider, Consumer: g.Consumer, Serial: 2, Revoked: true, Token: g.Token}
		}, "revocation carries only"},
		{"revocation with limits", func(g *Grant) {
			*g = Grant{Provider: g.Provider, Consumer: g.Consumer, Serial: 2, Revoked: true, Limits: Limits{Pods: 1}}
		}, "revocation carries only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := sample(t, p, c, 1)
			tt.change(&g)
			_, err := Seal(p, c.Public(), g)
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Seal = %s; want an error saying %q", safe(err), tt.says)
			}
			noToken(t, "Seal's error", err.Error())
			if strings.Contains(err.Error(), "hunter2") {
				t.Error("Seal's error quotes the server's password")
			}
			_, err = Open(c, p.Public(), sealWire(t, p, c.Public(), wireFields(t, g)))
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Open = %s; want ErrMalformed saying %q", safe(err), tt.says)
			}
			noToken(t, "Open's error", err.Error())
		})
	}
}

// The wire form is read strictly: unknown fields, other types, trailing
// data and non-JSON are refused without quoting the input.
func TestOpenReadsTheWireStrictly(t *testing.T) {
	p, c := newID(t), newID(t)
	base := func() map[string]any { return wireFields(t, sample(t, p, c, 1)) }
	raw := func(payload string) []byte {
		b, err := p.SealFor(c.Public(), Purpose, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	unknown := base()
	unknown["relay"] = "x"
	badType := base()
	badType["serial"] = "one"
	tokenType := base()
	tokenType["token"] = []string{secret}
	tests := []struct {
		name   string
		sealed []byte
		says   string
	}{
		{"unknown field", sealWire(t, p, c.Public(), unknown), "unknown field"},
		{"serial a string", sealWire(t, p, c.Public(), badType), "serial"},
		{"token a list", sealWire(t, p, c.Public(), tokenType), "token"},
		{"not JSON", raw("version=1 " + secret), "not JSON"},
		{"two objects", raw(`{"version":1} {}`), "after the grant"},
		{"null", raw(`null`), "version 0"},
		{"empty", raw(``), "truncated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(c, p.Public(), tt.sealed)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Open = %s; want ErrMalformed saying %q", safe(err), tt.says)
			}
			noToken(t, "Open's error", err.Error())
		})
	}
}

// Seal checks who seals for whom before anything else.
func TestSealChecksTheClusters(t *testing.T) {
	p, c, other := newID(t), newID(t), newID(t)
	g := sample(t, p, c, 1)
	if _, err := Seal(other, c.Public(), g); err == nil || !strings.Contains(err.Error(), "provider") {
		t.Errorf("Seal by another cluster = %s", safe(err))
	}
	if _, err := Seal(p, other.Public(), g); err == nil || !strings.Contains(err.Error(), "key of "+other.ClusterID()) {
		t.Errorf("Seal to another consumer's key = %s", safe(err))
	}
	if _, err := Seal(p, c.Public()[:5], g); err == nil {
		t.Error("Seal to a short key succeeded")
	}
}

func TestLimits(t *testing.T) {
	for _, q := range []string{"4", "500m", "0.5", ".5", "8Gi", "1e3", "2E", "1.5Ki", "100n", "3u", "0"} {
		if err := (Limits{CPU: q, Memory: q}).Validate(); err != nil {
			t.Errorf("quantity %q refused: %v", q, err)
		}
	}
	for _, q := range []string{"-1", "+1", "1 Gi", "1gi", "Gi", "1.2.3", "1e", "4 ", "0x10", "1GiB", strings.Repeat("9", 65)} {
		if err := (Limits{Memory: q}).Validate(); err == nil {
			t.Errorf("quantity %q accepted", q)
		}
	}
}

// The largest sealed grant Seal makes is within MaxSealedSize: a token and
// a CA bundle at their bounds fit.
func TestLargestGrantSeals(t *testing.T) {
	p, c := newID(t), newID(t)
	g := sample(t, p, c, 1)
	g.Token = NewToken(strings.Repeat("t", MaxTokenSize))
	ca := testCA(t)
	g.CAData = bytes.Repeat(ca, MaxCASize/len(ca))
	g.Server = "https://" + strings.Repeat("h", 200) + ":6443/" + strings.Repeat("p", MaxServerLength-220)
	g.Limits = Limits{CPU: strings.Repeat("9", 60) + "m", Memory: strings.Repeat("9", 60) + "Ei", Pods: 1 << 62, Namespaces: 1 << 62}
	sealed, err := Seal(p, c.Public(), g)
	if err != nil {
		t.Fatalf("Seal of a grant at its bounds: %s", safe(err))
	}
	t.Logf("largest grant: %d bytes sealed, bound %d", len(sealed), MaxSealedSize)
}
