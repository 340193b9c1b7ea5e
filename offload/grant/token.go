package grant

import (
	"fmt"
	"log/slog"
)

// redacted is what a Token shows of itself everywhere but Reveal.
const redacted = "[redacted]"

// Token is a bearer credential for the provider's API server. It never
// shows itself: printing it with any verb, logging it with slog, or
// marshalling it to JSON or text gives "[redacted]". Reveal is the one way
// to its bytes, for the Authorization header and for sealing.
type Token struct {
	// A pointer: where fmt bypasses the methods (%p on a value, a bad
	// verb), it prints the fields it reaches by reflection, and a pointer
	// field shows as an address.
	secret *credential
}

type credential struct{ s string }

// NewToken wraps a credential.
func NewToken(s string) Token {
	if s == "" {
		return Token{}
	}
	return Token{secret: &credential{s}}
}

// Reveal returns the credential itself. Never log, print or store what it
// returns.
func (t Token) Reveal() string {
	if t.secret == nil {
		return ""
	}
	return t.secret.s
}

// IsZero reports whether the token is empty.
func (t Token) IsZero() bool { return t.secret == nil }

// Len is the credential's length in bytes, which is safe to show.
func (t Token) Len() int { return len(t.Reveal()) }

// Equal reports whether two tokens hold the same credential.
func (t Token) Equal(u Token) bool { return t.Reveal() == u.Reveal() }

func (Token) String() string               { return redacted }
func (Token) GoString() string             { return "grant.Token(" + redacted + ")" }
func (Token) LogValue() slog.Value         { return slog.StringValue(redacted) }
func (Token) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }
func (Token) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Format covers every verb, so no flag or width reaches the secret.
func (t Token) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, t.GoString())
		return
	}
	fmt.Fprint(f, redacted)
}
