package grant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
)

// A token shows itself nowhere: not with any fmt verb or flag, not in
// slog's text or JSON output, not marshalled; alone, inside a Grant, by
// value or by pointer. Only Reveal gives it.
func TestTokenNeverShows(t *testing.T) {
	a, b := newID(t), newID(t)
	g := sample(t, a, b, 1)
	tok := g.Token
	values := map[string]any{"token": tok, "*token": &tok, "grant": g, "*grant": &g, "[]grant": []Grant{g}, "map": map[string]Token{"k": tok}}
	verbs := []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T", "%10.3s", "%-40v", "% x", "%#q", "%U", "%t", "%p"}
	for name, v := range values {
		for _, verb := range verbs {
			noToken(t, fmt.Sprintf("fmt %s of %s", verb, name), fmt.Sprintf(verb, v))
		}
		noToken(t, "fmt.Sprint of "+name, fmt.Sprint(v))
		noToken(t, "fmt.Sprintln of "+name, fmt.Sprintln(v))
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "v", v)
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "v", v)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", slog.Group("g", "v", v))
		noToken(t, "slog of "+name, buf.String())
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("json of %s: %v", name, err)
		}
		noToken(t, "json of "+name, string(j))
		noToken(t, "error wrapping "+name, fmt.Errorf("context %v: %w", v, errors.New("x")).Error())
	}
	if txt, _ := tok.MarshalText(); bytes.Contains(txt, []byte(secret)) {
		t.Error("MarshalText shows the token")
	}
	if tok.Reveal() != secret || tok.Len() != len(secret) || tok.IsZero() || !tok.Equal(NewToken(secret)) {
		t.Errorf("Reveal gives %d bytes, want the %d of the token", len(tok.Reveal()), len(secret))
	}
	if !(Token{}).IsZero() {
		t.Error("the zero token is not zero")
	}
}
