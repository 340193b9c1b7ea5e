package grant

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/flotilla-io/flotilla/identity"
)

// wire is a grant as sealed: JSON, with the token in clear inside the box.
// Grant itself never marshals its token; only this struct carries it.
type wire struct {
	Version   int       `json:"version"`
	Provider  string    `json:"provider"`
	Consumer  string    `json:"consumer"`
	Serial    uint64    `json:"serial"`
	Revoked   bool      `json:"revoked,omitempty"`
	IssuedAt  time.Time `json:"issuedAt,omitzero"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	Server    string    `json:"server,omitempty"`
	CA        string    `json:"ca,omitempty"` // PEM is ASCII: no base64 on top
	Token     string    `json:"token,omitempty"`
	Namespace string    `json:"namespace,omitempty"`
	Limits    Limits    `json:"limits,omitzero"`
}

// Seal checks g and seals it, signed by the provider id, so that only the
// consumer whose identity key is consumer opens it, as a grant from id.
func Seal(id identity.Identity, consumer ed25519.PublicKey, g Grant) ([]byte, error) {
	if g.Version == 0 {
		g.Version = Version
	}
	if err := g.validate(); err != nil {
		return nil, fmt.Errorf("seal grant for %s: %w", g.Consumer, err)
	}
	if len(consumer) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("seal grant for %s: consumer key of %d bytes, want %d", g.Consumer, len(consumer), ed25519.PublicKeySize)
	}
	if g.Provider != id.ClusterID() {
		return nil, fmt.Errorf("seal grant for %s: provider %s, but this cluster is %s", g.Consumer, g.Provider, id.ClusterID())
	}
	if owner := identity.ClusterID(consumer); g.Consumer != owner {
		return nil, fmt.Errorf("seal grant for %s: the key given is the key of %s", g.Consumer, owner)
	}
	w := wire{
		Version: g.Version, Provider: g.Provider, Consumer: g.Consumer, Serial: g.Serial, Revoked: g.Revoked,
		IssuedAt: g.IssuedAt.UTC().Round(0), ExpiresAt: g.ExpiresAt.UTC().Round(0),
		Server: g.Server, CA: string(g.CAData), Token: g.Token.Reveal(), Namespace: g.Namespace, Limits: g.Limits,
	}
	payload, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("seal grant for %s: encode: %w", g.Consumer, err)
	}
	sealed, err := id.SealFor(consumer, Purpose, payload)
	clear(payload)
	if err != nil {
		return nil, fmt.Errorf("seal grant for %s: %w", g.Consumer, err)
	}
	if len(sealed) > MaxSealedSize {
		return nil, fmt.Errorf("seal grant for %s: %d bytes sealed, over %d: a smaller CA bundle or token", g.Consumer, len(sealed), MaxSealedSize)
	}
	return sealed, nil
}

// Open opens a grant sealed to id and checks that provider sealed it, that
// it names id as its consumer and provider as its provider, and that it is
// well formed. Whether it is newer than the grant held, and not expired,
// is the Store's to check. Open never panics, and its errors never quote
// the token.
func Open(id identity.Identity, provider ed25519.PublicKey, sealed []byte) (Grant, error) {
	if len(provider) != ed25519.PublicKeySize {
		return Grant{}, fmt.Errorf("open grant: %w: provider key of %d bytes, want %d", ErrMalformed, len(provider), ed25519.PublicKeySize)
	}
	from := identity.ClusterID(provider)
	if len(sealed) > MaxSealedSize {
		return Grant{}, fmt.Errorf("open grant from %s: %w: %d bytes, over %d", from, ErrMalformed, len(sealed), MaxSealedSize)
	}
	msg, err := id.OpenFrom(provider, Purpose, sealed)
	switch {
	case errors.Is(err, identity.ErrNotSealedToUs):
		return Grant{}, fmt.Errorf("open grant from %s: %w: %w", from, ErrNotForUs, err)
	case errors.Is(err, identity.ErrBadSignature):
		return Grant{}, fmt.Errorf("open grant from %s: %w: %w", from, ErrForged, err)
	case err != nil:
		return Grant{}, fmt.Errorf("open grant from %s: %w: %w", from, ErrMalformed, err)
	}
	g, err := decode(msg)
	clear(msg)
	if err != nil {
		return Grant{}, fmt.Errorf("open grant from %s: %w: %w", from, ErrMalformed, err)
	}
	if g.Consumer != id.ClusterID() {
		return Grant{}, fmt.Errorf("open grant from %s: %w: a grant for another cluster (%s)", from, ErrNotForUs, g.Consumer)
	}
	if g.Provider != from {
		return Grant{}, fmt.Errorf("open grant from %s: %w: it names %s as its provider", from, ErrForged, g.Provider)
	}
	return g, nil
}

// decode reads the wire form strictly: one JSON object of known fields.
func decode(msg []byte) (Grant, error) {
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.DisallowUnknownFields()
	var w wire
	if err := dec.Decode(&w); err != nil {
		return Grant{}, errors.New(jsonProblem(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return Grant{}, errors.New("data after the grant")
	}
	g := Grant{
		Version: w.Version, Provider: w.Provider, Consumer: w.Consumer, Serial: w.Serial, Revoked: w.Revoked,
		IssuedAt: w.IssuedAt, ExpiresAt: w.ExpiresAt, Server: w.Server, Token: NewToken(w.Token),
		Namespace: w.Namespace, Limits: w.Limits,
	}
	if w.CA != "" {
		g.CAData = []byte(w.CA)
	}
	if err := g.validate(); err != nil {
		return Grant{}, err
	}
	return g, nil
}

// jsonProblem describes a decoding error without quoting the input: a
// syntax error's message is safe, a type error's may carry a value.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("not JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %.64q: a JSON %s, want %s", te.Field, te.Value, te.Type)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated JSON"
	}
	return "not a grant's JSON (unknown field or bad value)"
}
