package main

import "regexp"

// redactions are what gather blanks out of everything it writes: the
// shapes credentials take in logs, objects and pages. Secrets are never
// read; these catch what leaks elsewhere.
var redactions = []struct {
	re   *regexp.Regexp
	with string
}{
	// PEM private keys (a kubeconfig's, a serving certificate's).
	{regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----`), "[redacted: private key]"},
	// JSON Web Tokens: ServiceAccount tokens, the grants' tokens.
	{regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`), "[redacted: token]"},
	// Bearer tokens of any shape, in headers and logged requests.
	{regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}`), "${1}[redacted]"},
	// Flotilla's join tokens (they hold the federation key).
	{regexp.MustCompile(`flt1\.[A-Za-z0-9_-]+`), "[redacted: join token]"},
	// 32-byte keys in base64: WireGuard's, the federation key's.
	{regexp.MustCompile(`[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=`), "[redacted: key]"},
	// Fields named for a credential, in YAML, JSON, flags and logs.
	{regexp.MustCompile(`(?i)("?\b(client-key-data|client-certificate-data|token|password|private-?key|secret-?key|credential)"?\s*[:=]\s*"?)[^"\s,}]{8,}`), "${1}[redacted]"},
}

// redact blanks every credential redactions recognise in b.
func redact(b []byte) []byte {
	for _, r := range redactions {
		b = r.re.ReplaceAll(b, []byte(r.with))
	}
	return b
}
