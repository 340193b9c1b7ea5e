package discovery

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
)

// FederationKeySize is the size of a generated federation key (AES-256, as
// memberlist uses it to encrypt gossip).
const FederationKeySize = 32

// GenerateFederationKey makes a new random federation key.
func GenerateFederationKey() ([]byte, error) {
	k := make([]byte, FederationKeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("generate federation key: %w", err)
	}
	return k, nil
}

func validateKey(k []byte) error {
	switch len(k) {
	case 16, 24, 32:
		return nil
	}
	return fmt.Errorf("federation key is %d bytes, want 16, 24 or 32", len(k))
}

// Fingerprint is a public, stable name for a federation key: the first 8
// bytes of HMAC-SHA256(key, label), hex encoded. It lets an agent ignore
// other federations' mDNS adverts without revealing the key (recovering
// the key from it means inverting HMAC-SHA256).
func Fingerprint(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("flotilla federation fingerprint v1"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// fingerprints lists the fingerprints of every installed key. Adverts
// carry all of them so that, during a key rotation, agents that hold only
// the old or only the new key still recognise each other.
func fingerprints(keys [][]byte) []string {
	fps := make([]string, 0, len(keys))
	for _, k := range keys {
		fps = append(fps, Fingerprint(k))
	}
	return fps
}

// EncodeKeyring serialises a keyring for storage; the primary key comes
// first. The encoding is the concatenation of length-prefixed keys.
func EncodeKeyring(keys [][]byte) ([]byte, error) {
	var b []byte
	for _, k := range keys {
		if err := validateKey(k); err != nil {
			return nil, err
		}
		b = append(b, byte(len(k)))
		b = append(b, k...)
	}
	return b, nil
}

// DecodeKeyring is the inverse of EncodeKeyring.
func DecodeKeyring(b []byte) ([][]byte, error) {
	var keys [][]byte
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n {
			return nil, fmt.Errorf("decode federation keyring: key of %d bytes truncated", n)
		}
		k := append([]byte(nil), b[1:1+n]...)
		if err := validateKey(k); err != nil {
			return nil, fmt.Errorf("decode federation keyring: %w", err)
		}
		keys = append(keys, k)
		b = b[1+n:]
	}
	if len(keys) == 0 {
		return nil, errors.New("decode federation keyring: no keys")
	}
	return keys, nil
}

// A join token carries the federation key and where to join. It is a
// secret: whoever holds it can join the federation and read its gossip.
//
//	flt1.<base64url, unpadded, of: key length, key, seed count,
//	      (seed length, seed)*, first 4 bytes of SHA-256 of all before>
const tokenPrefix = "flt1."

// JoinToken is the decoded form of a join token.
type JoinToken struct {
	Key   []byte
	Seeds []string // "host:port" gossip addresses of existing members
}

// String names the token without revealing it (the key admits its
// holder to the federation), so a token that ends up in a log or an error
// leaks nothing. Encode is the one way to the secret.
func (t JoinToken) String() string {
	return fmt.Sprintf("join token (key %s, %d seeds)", Fingerprint(t.Key), len(t.Seeds))
}

// LogValue keeps slog from printing the key either.
func (t JoinToken) LogValue() slog.Value { return slog.StringValue(t.String()) }

// Encode encodes the token, refusing bad keys and seeds.
func (t JoinToken) Encode() (string, error) {
	if err := validateKey(t.Key); err != nil {
		return "", fmt.Errorf("encode join token: %w", err)
	}
	if len(t.Seeds) > 255 {
		return "", fmt.Errorf("encode join token: %d seeds, at most 255", len(t.Seeds))
	}
	b := []byte{byte(len(t.Key))}
	b = append(b, t.Key...)
	b = append(b, byte(len(t.Seeds)))
	for _, s := range t.Seeds {
		if err := validateSeed(s); err != nil {
			return "", fmt.Errorf("encode join token: %w", err)
		}
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	sum := sha256.Sum256(b)
	b = append(b, sum[:4]...)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// ParseJoinToken decodes a token made by JoinToken.Encode.
func ParseJoinToken(s string) (JoinToken, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, tokenPrefix) {
		return JoinToken{}, fmt.Errorf("join token: does not start with %q", tokenPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(s[len(tokenPrefix):])
	if err != nil {
		return JoinToken{}, fmt.Errorf("join token: %w", err)
	}
	if len(b) < 4 {
		return JoinToken{}, errors.New("join token: too short")
	}
	payload, check := b[:len(b)-4], b[len(b)-4:]
	if sum := sha256.Sum256(payload); !bytes.Equal(sum[:4], check) {
		return JoinToken{}, errors.New("join token: checksum does not match (token damaged or cut short?)")
	}
	var t JoinToken
	next := func(what string) ([]byte, error) {
		if len(payload) < 1 || len(payload) < 1+int(payload[0]) {
			return nil, fmt.Errorf("join token: %s truncated", what)
		}
		v := payload[1 : 1+int(payload[0])]
		payload = payload[1+int(payload[0]):]
		return v, nil
	}
	key, err := next("key")
	if err != nil {
		return JoinToken{}, err
	}
	if err := validateKey(key); err != nil {
		return JoinToken{}, fmt.Errorf("join token: %w", err)
	}
	t.Key = append([]byte(nil), key...)
	if len(payload) < 1 {
		return JoinToken{}, errors.New("join token: seed count missing")
	}
	n := int(payload[0])
	payload = payload[1:]
	for i := 0; i < n; i++ {
		seed, err := next("seed")
		if err != nil {
			return JoinToken{}, err
		}
		if err := validateSeed(string(seed)); err != nil {
			return JoinToken{}, fmt.Errorf("join token: %w", err)
		}
		t.Seeds = append(t.Seeds, string(seed))
	}
	if len(payload) != 0 {
		return JoinToken{}, fmt.Errorf("join token: %d trailing bytes", len(payload))
	}
	return t, nil
}

// ParseFederationKey accepts a join token or a bare key in standard or URL
// base64, so --federation-key takes either.
func ParseFederationKey(s string) (JoinToken, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, tokenPrefix) {
		return ParseJoinToken(s)
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil {
			if err := validateKey(k); err != nil {
				return JoinToken{}, err
			}
			return JoinToken{Key: k}, nil
		}
	}
	return JoinToken{}, errors.New("federation key: neither a join token (flt1.…) nor base64")
}

func validateSeed(s string) error {
	if len(s) == 0 || len(s) > 255 {
		return fmt.Errorf("seed %q: length %d, want 1..255", s, len(s))
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("seed %q: want host:port: %w", s, err)
	}
	if host == "" {
		return fmt.Errorf("seed %q: empty host", s)
	}
	if _, err := net.LookupPort("udp", port); err != nil {
		return fmt.Errorf("seed %q: bad port: %w", s, err)
	}
	return nil
}

// keyIDs returns short, non-secret names for logging keys.
func keyID(k []byte) string { return Fingerprint(k) }
