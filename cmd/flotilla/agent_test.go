package main

import (
	"bytes"
	"strings"
	"testing"
)

// A reserved range that is not a usable range is refused before anything
// starts, saying what was meant.
func TestAgentRefusesBadReservedCIDR(t *testing.T) {
	for _, tt := range []struct {
		arg    string
		code   int
		errHas string
	}{
		{"10.0.0.1/8", 2, "the network is 10.0.0.0/8"},
		{"172.30.0.0/16,banana", 2, `CIDR "banana"`},
		{"0.0.0.0/0", 2, "covers the whole address space"},
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"agent", "--state-dir", t.TempDir(), "--reserved-cidr", tt.arg}, &stdout, &stderr)
		if out := stderr.String(); code != tt.code || !strings.Contains(out, "reserved-cidr") || !strings.Contains(out, tt.errHas) {
			t.Errorf("--reserved-cidr %s: exit %d, stderr %q; want %d and %q", tt.arg, code, out, tt.code, tt.errHas)
		}
	}
}
