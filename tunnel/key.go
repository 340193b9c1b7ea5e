package tunnel

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/curve25519"
)

// KeyLen is the length of a WireGuard key in bytes.
const KeyLen = 32

// Key is a WireGuard Curve25519 key, public or private. Its text form is
// the standard base64 that wg(8) prints and reads.
type Key [KeyLen]byte

// GeneratePrivateKey returns a new clamped Curve25519 private key.
func GeneratePrivateKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return Key{}, fmt.Errorf("generate wireguard key: %w", err)
	}
	k.clamp()
	return k, nil
}

func (k *Key) clamp() {
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
}

// ParseKey decodes a base64 WireGuard key as printed by `wg genkey` or
// `wg pubkey`.
func ParseKey(s string) (Key, error) {
	s = strings.TrimSpace(s)
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return Key{}, fmt.Errorf("parse wireguard key: not base64: %w", err)
	}
	if len(b) != KeyLen {
		return Key{}, fmt.Errorf("parse wireguard key: %d bytes, want %d", len(b), KeyLen)
	}
	var k Key
	copy(k[:], b)
	return k, nil
}

// KeyFromBytes takes a raw 32-byte key, as stored in the ledger.
func KeyFromBytes(b []byte) (Key, error) {
	if len(b) != KeyLen {
		return Key{}, fmt.Errorf("wireguard key: %d bytes, want %d", len(b), KeyLen)
	}
	var k Key
	copy(k[:], b)
	return k, nil
}

// IsZero reports whether k is unset.
func (k Key) IsZero() bool { return k == Key{} }

// PublicKey derives the public key of the private key k.
func (k Key) PublicKey() Key {
	var pub Key
	curve25519.ScalarBaseMult((*[32]byte)(&pub), (*[32]byte)(&k))
	return pub
}

func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// MarshalText implements encoding.TextMarshaler.
func (k Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (k *Key) UnmarshalText(b []byte) error {
	parsed, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = parsed
	return nil
}

// LoadOrCreateKeyFile reads a private key in wg(8) text form from path, or
// creates one there with mode 0600 if the file does not exist. The agent
// keeps its key in the ledger; this is for standalone use and tests.
func LoadOrCreateKeyFile(path string) (Key, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := ParseKey(string(b))
		if err != nil {
			return Key{}, fmt.Errorf("key file %s: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return Key{}, fmt.Errorf("read key file: %w", err)
	}
	k, err := GeneratePrivateKey()
	if err != nil {
		return Key{}, err
	}
	return k, WriteKeyFile(path, k)
}

// WriteKeyFile stores k at path with mode 0600, replacing the file
// atomically so a crash never leaves half a key.
func WriteKeyFile(path string, k Key) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".key-*")
	if err != nil {
		return fmt.Errorf("write key file: %w", err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("write key file: %w", err)
	}
	if _, err := f.WriteString(k.String() + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("write key file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write key file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write key file: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write key file: %w", err)
	}
	return nil
}
