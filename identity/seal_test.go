package identity

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"
)

func mustGenerate(t testing.TB) Identity {
	t.Helper()
	id, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestSealForOpensOnlyAsSealed(t *testing.T) {
	alice, bob, carol := mustGenerate(t), mustGenerate(t), mustGenerate(t)
	msg := []byte("credential: short-lived")
	sealed, err := alice.SealFor(bob.Public(), "grant", msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(sealed) != len(msg)+SealOverhead {
		t.Errorf("sealed is %d bytes, want %d", len(sealed), len(msg)+SealOverhead)
	}
	if bytes.Contains(sealed, msg) {
		t.Error("sealed message carries the plaintext")
	}
	got, err := bob.OpenFrom(alice.Public(), "grant", sealed)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("bob opens %q, %v; want %q", got, err, msg)
	}

	// Carol holds a message Alice sealed to her; re-sealed to Bob in
	// Alice's name it must not open as Alice's.
	toCarol, err := alice.SealFor(carol.Public(), "grant", msg)
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	wrongFormat := bytes.Clone(sealed)
	wrongFormat[0] = 2
	tests := []struct {
		name    string
		opener  Identity
		from    ed25519.PublicKey
		purpose string
		sealed  []byte
		want    error
	}{
		{"wrong recipient", carol, alice.Public(), "grant", sealed, ErrNotSealedToUs},
		{"tampered", bob, alice.Public(), "grant", tampered, ErrNotSealedToUs},
		{"wrong purpose", bob, alice.Public(), "grant-renewal", sealed, ErrBadSignature},
		{"wrong sender", bob, carol.Public(), "grant", sealed, ErrBadSignature},
		{"sealed to another", bob, alice.Public(), "grant", reseal(t, carol, bob, toCarol, "grant"), ErrBadSignature},
		{"unknown format", bob, alice.Public(), "grant", wrongFormat, nil},
		{"truncated", bob, alice.Public(), "grant", sealed[:SealOverhead-1], nil},
		{"empty purpose", bob, alice.Public(), "", sealed, nil},
		{"short sender key", bob, alice.Public()[:31], "grant", sealed, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.opener.OpenFrom(tt.from, tt.purpose, tt.sealed)
			if err == nil {
				t.Fatalf("opened %q", got)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

// reseal opens what holder got and seals its signed inner part
// to another recipient, as a dishonest recipient forwarding it would.
func reseal(t *testing.T, holder, to Identity, sealed []byte, purpose string) []byte {
	t.Helper()
	xpub, err := montgomeryPublic(holder.Public())
	if err != nil {
		t.Fatal(err)
	}
	xpriv := montgomeryPrivate(holder.Private)
	inner, ok := box.OpenAnonymous(nil, sealed[1:], xpub, &xpriv)
	if !ok {
		t.Fatal("holder cannot open its own message")
	}
	xto, err := montgomeryPublic(to.Public())
	if err != nil {
		t.Fatal(err)
	}
	out, err := box.SealAnonymous([]byte{sealFormat}, inner, xto, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSealForRefusesBadRecipients(t *testing.T) {
	alice := mustGenerate(t)
	identityPoint := make([]byte, 32)
	identityPoint[0] = 1 // (0, 1): small order
	notAPoint := make([]byte, 32)
	notAPoint[0] = 2 // y = 2 is on no Edwards curve point
	for _, tt := range []struct {
		name    string
		to      ed25519.PublicKey
		purpose string
	}{
		{"short key", alice.Public()[:16], "grant"},
		{"small order", identityPoint, "grant"},
		{"not a point", notAPoint, "grant"},
		{"empty purpose", alice.Public(), ""},
		{"long purpose", alice.Public(), strings.Repeat("p", MaxPurposeLen+1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := alice.SealFor(tt.to, tt.purpose, []byte("x")); err == nil {
				t.Fatal("sealed")
			}
		})
	}
}

// The X25519 key pair derived from an identity is a key pair: the public
// half from the Edwards point is the base point times the private half.
func TestMontgomeryKeysMatch(t *testing.T) {
	for range 16 {
		id := mustGenerate(t)
		pub, err := montgomeryPublic(id.Public())
		if err != nil {
			t.Fatal(err)
		}
		priv := montgomeryPrivate(id.Private)
		want, err := curve25519.X25519(priv[:], curve25519.Basepoint)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(pub[:], want) {
			t.Fatalf("public %x, private gives %x", pub[:], want)
		}
	}
}

// FuzzOpen feeds arbitrary bytes to OpenFrom: it never panics, and only
// messages Alice sealed open.
func FuzzOpen(f *testing.F) {
	alice, err := FromSeed(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		f.Fatal(err)
	}
	bob, err := FromSeed(bytes.Repeat([]byte{2}, 32))
	if err != nil {
		f.Fatal(err)
	}
	valid, err := alice.SealFor(bob.Public(), "grant", []byte("credential"))
	if err != nil {
		f.Fatal(err)
	}
	empty, err := alice.SealFor(bob.Public(), "grant", nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(empty)
	f.Add(valid[:SealOverhead])
	f.Add([]byte{})
	f.Add([]byte{sealFormat})
	f.Add(append([]byte{sealFormat}, make([]byte, SealOverhead)...))
	f.Fuzz(func(t *testing.T, sealed []byte) {
		msg, err := bob.OpenFrom(alice.Public(), "grant", sealed)
		if err != nil {
			if msg != nil {
				t.Fatalf("refused with a message: %q", msg)
			}
			return
		}
		// Each fuzzing process seals its own seeds (the ephemeral key is
		// random), so compare what opened, not the bytes.
		if !bytes.Equal(msg, []byte("credential")) && len(msg) != 0 {
			t.Fatalf("opened a message that was never sealed: %x -> %q", sealed, msg)
		}
	})
}
