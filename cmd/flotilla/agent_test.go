package main

import (
	"bytes"
	"fmt"
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

// A bad --cluster-label is refused before anything starts, saying what is
// wrong with it.
func TestAgentRefusesBadClusterLabel(t *testing.T) {
	tooMany := []string{}
	for i := range 65 {
		tooMany = append(tooMany, "--cluster-label", fmt.Sprintf("l%d=v", i))
	}
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		errHas string
	}{
		{"no value", []string{"--cluster-label", "region"}, 2, "want key=value"},
		{"flotilla's domain", []string{"--cluster-label", "flotilla.io/tenant=x"}, 2, "flotilla's own"},
		{"bad value", []string{"--cluster-label", "region=eu west"}, 2, `value "eu west"`},
		{"two values", []string{"--cluster-label", "region=a", "--cluster-label", "region=b"}, 2, "region given twice"},
		{"too many", tooMany, 1, "65 labels, over 64"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"agent", "--state-dir", t.TempDir()}, tt.args...), &stdout, &stderr)
			if out := stderr.String(); code != tt.code || !strings.Contains(out, "cluster-label") || !strings.Contains(out, tt.errHas) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, out, tt.code, tt.errHas)
			}
		})
	}
}

// An unknown --traffic mode is refused before anything starts, naming the
// two modes there are.
func TestAgentRefusesBadTraffic(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"agent", "--state-dir", t.TempDir(), "--traffic", "segregated-ish"}, &stdout, &stderr)
	if out := stderr.String(); code != 2 || !strings.Contains(out, "--traffic") || !strings.Contains(out, `"Full" or "Segregated"`) {
		t.Errorf("exit %d, stderr %q; want 2 and the modes named", code, out)
	}
}

// An unknown --offload-to policy is refused before anything starts,
// naming the two there are.
func TestAgentRefusesBadOffloadTo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"agent", "--state-dir", t.TempDir(), "--offload-to", "always"}, &stdout, &stderr)
	if out := stderr.String(); code != 2 || !strings.Contains(out, "--offload-to") || !strings.Contains(out, "want manual or auto") {
		t.Errorf("exit %d, stderr %q; want 2 and the policies named", code, out)
	}
}

// A block size no pod range could use is refused before anything starts,
// with an example of what is meant.
func TestAgentRefusesBadPodBlockBits(t *testing.T) {
	for _, arg := range []string{"8", "33"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"agent", "--state-dir", t.TempDir(), "--pod-block-bits", arg}, &stdout, &stderr)
		if out := stderr.String(); code == 0 || !strings.Contains(out, "--pod-block-bits "+arg) || !strings.Contains(out, "10.1.2.0/24") {
			t.Errorf("--pod-block-bits %s: exit %d, stderr %q; want a failure with an example", arg, code, out)
		}
	}
}
