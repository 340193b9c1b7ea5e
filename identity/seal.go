package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"errors"
	"fmt"

	"filippo.io/edwards25519"
	"golang.org/x/crypto/nacl/box"
)

// A sealed message is readable only by the cluster it is sealed to, says
// which cluster sealed it and for what purpose, and cannot be opened for
// another purpose, from another sender or by another recipient:
//
//	0     format (1)
//	1..   anonymous sealed box (NaCl crypto_box_seal: ephemeral X25519 key,
//	      XSalsa20-Poly1305) to the recipient's X25519 key, holding:
//	        Ed25519 signature (64 bytes) by the sender of
//	          sealDomain || format || len(purpose) || purpose ||
//	          sender key || recipient key || message
//	        message
//
// The box alone would let anyone seal to the recipient; the signature
// names the sender, and signing the recipient's key keeps a recipient
// from re-sealing what it received to a third cluster in the sender's
// name. The X25519 keys are derived from the Ed25519 identity, so a
// cluster's one published key serves both.
const (
	sealFormat = 1
	sealDomain = "flotilla/sealed/v1\x00"
	// MaxPurposeLen bounds the purpose string of SealFor.
	MaxPurposeLen = 255
	// SealOverhead is how much longer a sealed message is than the message.
	SealOverhead = 1 + box.AnonymousOverhead + ed25519.SignatureSize
)

// ErrNotSealedToUs is returned by OpenFrom when the box does not open with
// this identity: it was sealed to another cluster, or damaged.
var ErrNotSealedToUs = errors.New("does not open with this cluster's identity (sealed to another cluster, or damaged)")

// SealFor seals msg so that only the holder of the identity key to can
// open it, and only as a message from id for purpose.
func (id Identity) SealFor(to ed25519.PublicKey, purpose string, msg []byte) ([]byte, error) {
	if err := validatePurpose(purpose); err != nil {
		return nil, fmt.Errorf("seal for %s: %w", keyName(to), err)
	}
	xto, err := montgomeryPublic(to)
	if err != nil {
		return nil, fmt.Errorf("seal for %s: %w", keyName(to), err)
	}
	inner := make([]byte, 0, ed25519.SignatureSize+len(msg))
	inner = append(inner, id.Sign(sealSigned(purpose, id.Public(), to, msg))...)
	inner = append(inner, msg...)
	out := make([]byte, 1, SealOverhead+len(msg))
	out[0] = sealFormat
	out, err = box.SealAnonymous(out, inner, xto, rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("seal for %s: %w", keyName(to), err)
	}
	return out, nil
}

// OpenFrom opens a message sealed to id by SealFor, checking that from
// sealed it for purpose. It never panics on any input.
func (id Identity) OpenFrom(from ed25519.PublicKey, purpose string, sealed []byte) ([]byte, error) {
	if err := validatePurpose(purpose); err != nil {
		return nil, fmt.Errorf("open sealed message: %w", err)
	}
	if len(from) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("open sealed message: sender key is %d bytes, want %d", len(from), ed25519.PublicKeySize)
	}
	if len(sealed) < SealOverhead {
		return nil, fmt.Errorf("open sealed message from %s: %d bytes, at least %d", ClusterID(from), len(sealed), SealOverhead)
	}
	if sealed[0] != sealFormat {
		return nil, fmt.Errorf("open sealed message from %s: format %d, this build reads %d", ClusterID(from), sealed[0], sealFormat)
	}
	xpub, err := montgomeryPublic(id.Public())
	if err != nil {
		return nil, fmt.Errorf("open sealed message: own key: %w", err)
	}
	xpriv := montgomeryPrivate(id.Private)
	inner, ok := box.OpenAnonymous(nil, sealed[1:], xpub, &xpriv)
	clear(xpriv[:])
	if !ok {
		return nil, fmt.Errorf("open sealed message from %s: %w", ClusterID(from), ErrNotSealedToUs)
	}
	sig, msg := inner[:ed25519.SignatureSize], inner[ed25519.SignatureSize:]
	if !ed25519.Verify(from, sealSigned(purpose, from, id.Public(), msg), sig) {
		return nil, fmt.Errorf("open sealed message: not sealed by %s for %q (another sender or purpose): %w",
			ClusterID(from), purpose, ErrBadSignature)
	}
	return msg, nil
}

func validatePurpose(p string) error {
	if p == "" || len(p) > MaxPurposeLen {
		return fmt.Errorf("purpose of %d bytes, want 1..%d", len(p), MaxPurposeLen)
	}
	return nil
}

func sealSigned(purpose string, from, to ed25519.PublicKey, msg []byte) []byte {
	b := make([]byte, 0, len(sealDomain)+2+len(purpose)+2*ed25519.PublicKeySize+len(msg))
	b = append(b, sealDomain...)
	b = append(b, sealFormat, byte(len(purpose)))
	b = append(b, purpose...)
	b = append(b, from...)
	b = append(b, to...)
	return append(b, msg...)
}

// montgomeryPublic maps an Ed25519 public key to the X25519 public key of
// the same secret (the birational map from Edwards to Montgomery form).
// Keys of small order are refused: sealing to one would give a key that
// anybody can compute.
func montgomeryPublic(pub ed25519.PublicKey) (*[32]byte, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	p, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return nil, fmt.Errorf("public key is not an Ed25519 point: %w", err)
	}
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return nil, errors.New("public key is a point of small order")
	}
	var out [32]byte
	copy(out[:], p.BytesMontgomery())
	return &out, nil
}

// montgomeryPrivate is the X25519 private key of an Ed25519 key: the
// clamped first half of SHA-512 of the seed (RFC 8032, 5.1.5), the scalar
// Ed25519 itself signs with.
func montgomeryPrivate(priv ed25519.PrivateKey) [32]byte {
	h := sha512.Sum512(priv.Seed())
	var s [32]byte
	copy(s[:], h[:32])
	clear(h[:])
	s[0] &= 248
	s[31] &= 127
	s[31] |= 64
	return s
}

// keyName names a key in an error, even a malformed one.
func keyName(pub ed25519.PublicKey) string {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Sprintf("a key of %d bytes", len(pub))
	}
	return ClusterID(pub)
}
