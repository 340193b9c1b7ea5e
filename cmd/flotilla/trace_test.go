package main

import (
	"strings"
	"testing"
)

func TestTraceUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "name the SOURCE and the DESTINATION"},
		{[]string{"client"}, 2, "name the SOURCE and the DESTINATION"},
		{[]string{"client", "10.70.0.5", "-o", "wide"}, 2, `-o "wide": want json or yaml`},
		{[]string{"client", "10.70.0.5", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-h"}, 0, "Usage:\n  flotilla trace SOURCE DESTINATION [flags]"},
	} {
		code, out, errOut := flotilla(append([]string{"trace"}, tc.args...)...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("trace %q: exit %d, stderr:\n%s\nwant %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}
