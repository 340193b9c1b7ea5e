package main

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/discovery"
)

// Every shape of credential is blanked; what a reader needs to diagnose
// (names, IDs, addresses, fingerprints) is kept.
func TestRedact(t *testing.T) {
	key := make([]byte, 32)
	rand.Read(key)
	join, err := discovery.JoinToken{Key: key, Seeds: []string{"192.0.2.1:7946"}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	wg := base64.StdEncoding.EncodeToString(key)
	jwt := "eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJhdWQiOlsiaHR0cHM6Ly9rdWJlcm5ldGVzIl19.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
	pem := "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\nabc\n-----END EC PRIVATE KEY-----"
	for _, tc := range []struct{ in, secret string }{
		{"token: " + jwt, jwt},
		{`{"token":"` + jwt + `"}`, jwt},
		{"Authorization: Bearer sha256~abcdefghijklmnop", "sha256~abcdefghijklmnop"},
		{"join with " + join + " now", join},
		{"private key " + wg, wg},
		{`"privateKey": "` + wg + `"`, wg},
		{pem, "MHcCAQEEIB"},
		{"client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQ==", "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQ=="},
		{"--password=hunter2hunter2", "hunter2hunter2"},
	} {
		got := string(redact([]byte(tc.in)))
		if strings.Contains(got, tc.secret) || !strings.Contains(got, "redacted") {
			t.Errorf("redact(%q) = %q: the credential is still there", tc.in, got)
		}
	}
	keep := "peer cabcdefghijklmnopqrstuvwxyz (alpha) at 10.70.0.5, key fingerprint " + discovery.Fingerprint(key) +
		", pod flotilla-agent-7d9f8c6b5-x2x4z, key: region, condition OffloadCredential Ready"
	if got := string(redact([]byte(keep))); got != keep {
		t.Errorf("redact(%q) = %q, want it unchanged", keep, got)
	}
}

// Redacting twice is redacting once: nothing redacted looks like a
// credential again.
func FuzzRedact(f *testing.F) {
	f.Add("token: eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4eHh4eHgifQ.sig")
	f.Add("Bearer abcdefghijkl flt1.AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		once := redact([]byte(s))
		if twice := redact(once); string(twice) != string(once) {
			t.Errorf("redact(redact(%q)) = %q, not %q", s, twice, once)
		}
	})
}
