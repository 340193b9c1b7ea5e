// Package identity holds a cluster's Ed25519 identity and the cluster ID
// derived from it. Because the ID is a hash of the public key, nobody can
// claim another cluster's ID without its private key.
package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
)

// IDLength is the length of a cluster ID: "c" followed by the lowercase,
// unpadded base32 of the first 16 bytes of SHA-256(public key). It is a
// valid DNS label and Kubernetes object name.
const IDLength = 1 + 26

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// ClusterID derives the cluster ID of a public key.
func ClusterID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "c" + strings.ToLower(idEncoding.EncodeToString(sum[:16]))
}

// ValidateClusterID reports whether id has the form ClusterID produces.
func ValidateClusterID(id string) error {
	if len(id) != IDLength || id[0] != 'c' || strings.ToLower(id) != id {
		return fmt.Errorf("cluster ID %q: want %d lowercase characters starting with 'c'", id, IDLength)
	}
	if _, err := idEncoding.DecodeString(strings.ToUpper(id[1:])); err != nil {
		return fmt.Errorf("cluster ID %q: not base32: %w", id, err)
	}
	return nil
}

// Identity is a cluster's signing key.
type Identity struct {
	Private ed25519.PrivateKey
}

// Generate makes a new random identity.
func Generate() (Identity, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Identity{}, fmt.Errorf("generate identity key: %w", err)
	}
	return Identity{Private: priv}, nil
}

// FromSeed rebuilds an identity from its 32-byte seed, the form in which
// it is stored.
func FromSeed(seed []byte) (Identity, error) {
	if len(seed) != ed25519.SeedSize {
		return Identity{}, fmt.Errorf("identity seed: %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	return Identity{Private: ed25519.NewKeyFromSeed(seed)}, nil
}

// Seed returns the 32-byte seed to store.
func (id Identity) Seed() []byte { return id.Private.Seed() }

// Public returns the public key.
func (id Identity) Public() ed25519.PublicKey { return id.Private.Public().(ed25519.PublicKey) }

// ClusterID returns the cluster ID of this identity.
func (id Identity) ClusterID() string { return ClusterID(id.Public()) }

// Sign signs msg.
func (id Identity) Sign(msg []byte) []byte { return ed25519.Sign(id.Private, msg) }

// ErrBadSignature is returned by Verify when the signature does not match.
var ErrBadSignature = errors.New("signature does not verify")

// Verify checks that sig is pub's signature of msg and that pub is the key
// of clusterID.
func Verify(clusterID string, pub ed25519.PublicKey, msg, sig []byte) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("public key of %s: %d bytes, want %d", clusterID, len(pub), ed25519.PublicKeySize)
	}
	if got := ClusterID(pub); got != clusterID {
		return fmt.Errorf("public key belongs to %s, not %s", got, clusterID)
	}
	if !ed25519.Verify(pub, msg, sig) {
		return fmt.Errorf("statement of %s: %w", clusterID, ErrBadSignature)
	}
	return nil
}
