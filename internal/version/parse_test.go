package version

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := `{"version":"v0.3.0","commit":"abc","goVersion":"go1.26","platform":"linux/arm64","protocol":{"current":4,"min":2,"max":5}}`
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"a build", good, ""},
		{"fields of a newer build", strings.Replace(good, `"commit"`, `"sbom":{"x":1},"commit"`, 1), ""},
		{"not JSON", "<html>503</html>", "build is not JSON"},
		{"truncated", good[:40], "build is not JSON"},
		{"no version", `{"commit":"abc","protocol":{"current":4,"min":2,"max":5}}`, "build names no version"},
		{"a terminal escape", strings.Replace(good, "v0.3.0", `v0.3.0\u001b[2J`, 1), "not printable"},
		{"current outside the range", strings.Replace(good, `"current":4`, `"current":6`, 1), "protocol range: writes 6, reads 2 to 5: not a range"},
		{"no range", `{"version":"v0.3.0"}`, "protocol range: writes 0, reads 0 to 0"},
		{"too long", `{"version":"` + strings.Repeat("a", MaxEncoded) + `"}`, "over 65536"},
		{"a long field", strings.Replace(good, "abc", strings.Repeat("a", 300), 1), "commit of 300 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Parse([]byte(tc.in))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tc.wantErr == "" && (b.Version != "v0.3.0" || b.Protocol != Protocol{Current: 4, Min: 2, Max: 5}):
				t.Errorf("Parse: %+v", b)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Parse: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// Two ranges interoperate when each reads the version the other writes.
func TestInteroperates(t *testing.T) {
	for _, tc := range []struct {
		a, b Protocol
		want bool
	}{
		{Protocol{Current: 4, Min: 2, Max: 5}, Protocol{Current: 4, Min: 2, Max: 5}, true},
		{Protocol{Current: 5, Min: 4, Max: 6}, Protocol{Current: 4, Min: 2, Max: 5}, true},
		{Protocol{Current: 6, Min: 5, Max: 7}, Protocol{Current: 4, Min: 2, Max: 5}, false},
		{Protocol{Current: 5, Min: 5, Max: 6}, Protocol{Current: 4, Min: 2, Max: 5}, false},
	} {
		if got := tc.a.Interoperates(tc.b); got != tc.want || tc.b.Interoperates(tc.a) != tc.want {
			t.Errorf("%+v with %+v: %v, want %v both ways", tc.a, tc.b, got, tc.want)
		}
	}
}

// Whatever an agent answers, Parse returns a build whose range is one, or
// an error; never a panic. A build it accepts encodes to one it accepts
// again, the same.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":"v0.3.0","commit":"abc","date":"2026-01-02T03:04:05Z","goVersion":"go1.26","platform":"linux/amd64","protocol":{"current":4,"min":2,"max":5}}`))
	f.Add([]byte(`{"version":"dev","protocol":{"current":1,"min":1,"max":1},"extra":[1,2]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"version":"\u0000"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Parse(data)
		if err != nil {
			return
		}
		if b.Version == "" || b.Protocol.check() != nil || !b.Protocol.Reads(b.Protocol.Current) {
			t.Fatalf("accepted %+v", b)
		}
		again, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if b2, err := Parse(again); err != nil || b2 != b {
			t.Fatalf("re-encoded %s: %+v, %v", again, b2, err)
		}
	})
}
