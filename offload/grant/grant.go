package grant

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/flotilla-io/flotilla/identity"
)

// Version is the grant format this package writes and reads. A grant of
// another version is refused: formats change only with a new number.
const Version = 1

// Purpose is what grants are sealed for (identity.SealFor): a message
// sealed for anything else never opens as a grant.
const Purpose = "flotilla.io/grant/v1"

// Bounds on a grant, so that a grant rides in a peering statement and a
// hostile provider cannot make a consumer hold much.
const (
	// MaxTokenSize bounds the token; service account tokens are about 1 KiB.
	MaxTokenSize = 16 << 10
	// MaxCASize bounds the CA bundle, about ten certificates.
	MaxCASize = 16 << 10
	// MaxServerLength bounds the API server URL.
	MaxServerLength = 2048
	// MaxSealedSize bounds a sealed grant; a peering Hello carries it, with
	// everything else, in 64 KiB.
	MaxSealedSize = 40 << 10
)

// Errors a grant is refused with; each refusal wraps one of them.
var (
	// ErrMalformed: not a grant this agent reads (damaged, out of bounds,
	// another version).
	ErrMalformed = errors.New("malformed grant")
	// ErrNotForUs: sealed to another cluster, or naming another consumer.
	ErrNotForUs = errors.New("grant not for this cluster")
	// ErrForged: not sealed by the provider it claims to come from.
	ErrForged = errors.New("grant not from that provider")
	// ErrReplayed: older than the grant held from that provider, or a
	// different grant with the same serial.
	ErrReplayed = errors.New("replayed or stale grant")
	// ErrExpired: the credential's lifetime is over.
	ErrExpired = errors.New("grant expired")
)

// Grant lets a consumer use a provider's API server: a credential for a
// tenant namespace, with the limits it comes with. A provider sends a new
// grant, with a higher serial, whenever anything in it changes (a renewed
// token included), and a revocation, with a higher serial still, when it
// withdraws it. Printing or logging a Grant never shows the token.
type Grant struct {
	// Version is the format; Seal fills in Version when it is zero.
	Version int
	// Provider and Consumer are the cluster IDs of the two sides.
	Provider string
	Consumer string
	// Serial grows with every grant or revocation the provider sends
	// this consumer; it starts at 1.
	Serial uint64
	// Revoked withdraws every earlier grant; a revocation carries only
	// the version, the cluster IDs and the serial.
	Revoked bool
	// IssuedAt and ExpiresAt bound the token's life.
	IssuedAt  time.Time
	ExpiresAt time.Time
	// Server is the https URL of the provider's API server.
	Server string
	// CAData is the PEM bundle of the CAs the API server's certificate is
	// checked against.
	CAData []byte
	// Token is the bearer token of the consumer's service account.
	Token Token
	// Namespace is the consumer's tenant namespace on the provider.
	Namespace string
	Limits    Limits
}

// validate checks g as Seal writes and Open reads it. Its errors never
// quote the token.
func (g *Grant) validate() error {
	if g.Version != Version {
		return fmt.Errorf("version %d, this agent reads %d: upgrade the older of the two agents", g.Version, Version)
	}
	if err := identity.ValidateClusterID(g.Provider); err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	if err := identity.ValidateClusterID(g.Consumer); err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	if g.Provider == g.Consumer {
		return errors.New("provider and consumer are the same cluster")
	}
	if g.Serial == 0 {
		return errors.New("serial 0: serials start at 1")
	}
	if g.Revoked {
		if !g.IssuedAt.IsZero() || !g.ExpiresAt.IsZero() || g.Server != "" || len(g.CAData) > 0 ||
			!g.Token.IsZero() || g.Namespace != "" || g.Limits != (Limits{}) {
			return errors.New("a revocation carries only the cluster IDs and the serial")
		}
		return nil
	}
	if g.IssuedAt.IsZero() || !g.IssuedAt.Before(g.ExpiresAt) {
		return fmt.Errorf("issued at %s, expires at %s: want a time issued before the expiry",
			g.IssuedAt.UTC().Format(time.RFC3339), g.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if err := checkServer(g.Server); err != nil {
		return err
	}
	if err := checkCA(g.CAData); err != nil {
		return err
	}
	if err := checkToken(g.Token); err != nil {
		return err
	}
	if err := checkLabel(g.Namespace); err != nil {
		return fmt.Errorf("namespace: %w", err)
	}
	if err := g.Limits.Validate(); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	return nil
}

func checkServer(s string) error {
	if s == "" {
		return errors.New("no API server URL")
	}
	if len(s) > MaxServerLength {
		return fmt.Errorf("API server URL of %d bytes, over %d", len(s), MaxServerLength)
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL, credentials included
		}
		return fmt.Errorf("API server URL: %w", err)
	}
	// Only the scheme and host are quoted: a query might hold a secret.
	switch {
	case u.User != nil:
		return errors.New("API server URL carries credentials: the grant's token is the only one")
	case u.Scheme != "https":
		return fmt.Errorf("API server URL of scheme %.20q: want https", u.Scheme)
	case u.Hostname() == "":
		return errors.New("API server URL without a host")
	case u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || u.ForceQuery:
		return fmt.Errorf("API server URL of host %.255q: want scheme, host, port and path only", u.Host)
	}
	return nil
}

// checkCA wants a bundle of PEM certificates and nothing else: a private
// key sent by mistake is refused rather than kept.
func checkCA(b []byte) error {
	if len(b) == 0 {
		return errors.New("no CA bundle")
	}
	if len(b) > MaxCASize {
		return fmt.Errorf("CA bundle of %d bytes, over %d", len(b), MaxCASize)
	}
	for i, c := range b {
		if (c < ' ' || c > '~') && c != '\n' && c != '\r' && c != '\t' {
			return fmt.Errorf("CA bundle: byte %d is not ASCII text, as PEM is", i)
		}
	}
	n, rest := 0, b
	for ; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("CA bundle: block %d is %.40q, want CERTIFICATE blocks only", n+1, block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("CA bundle: certificate %d: %w", n+1, err)
		}
	}
	if n == 0 {
		return errors.New("CA bundle holds no PEM certificate")
	}
	if bytes.Contains(rest, []byte("-----BEGIN")) {
		return fmt.Errorf("CA bundle: block %d does not decode as PEM", n+1)
	}
	return nil
}

// checkToken wants what a bearer token can be in an HTTP header.
func checkToken(t Token) error {
	s := t.Reveal()
	if s == "" {
		return errors.New("no token")
	}
	if len(s) > MaxTokenSize {
		return fmt.Errorf("token of %d bytes, over %d", len(s), MaxTokenSize)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return fmt.Errorf("token: byte %d of %d is whitespace or not printable ASCII", i, len(s))
		}
	}
	return nil
}

// checkLabel wants a DNS label (RFC 1123), as namespace names are.
func checkLabel(s string) error {
	if s == "" || len(s) > 63 {
		return fmt.Errorf("%q: want 1 to 63 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return fmt.Errorf("%q: want lowercase letters, digits and inner dashes", s)
		}
	}
	return nil
}
