package main

import (
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/internal/version"
)

// An agent whose protocol range and the client's do not read each
// other's versions is flagged, and so is one that was not read: both make
// the exit status 1. An agent of the same range is printed plainly.
func TestVersionsFlagSkew(t *testing.T) {
	client := version.Info{Version: "v0.4.0", Protocol: version.Protocol{Current: 5, Min: 4, Max: 6}}
	for _, tc := range []struct {
		name  string
		agent agentBuild
		want  string
		agree bool
	}{
		{"N-1", agentBuild{Pod: "ns/a", Node: "gw", Build: &version.Info{Version: "v0.3.0", Protocol: version.Protocol{Current: 4, Min: 2, Max: 5}}, Interoperates: true}, "agent ns/a on gw:\n  version:  v0.3.0", true},
		{"N-2", agentBuild{Pod: "ns/a", Node: "gw", Build: &version.Info{Version: "v0.2.0", Protocol: version.Protocol{Current: 3, Min: 2, Max: 4}}}, "  SKEW:     this client writes 5 and reads 4 to 6", false},
		{"not read", agentBuild{Pod: "ns/a", Error: "its /build: build is not JSON"}, "agent ns/a:\n  not read: its /build: build is not JSON", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := versions{Client: client, Agents: []agentBuild{tc.agent}}
			var out strings.Builder
			writeVersions(&out, v)
			if !strings.Contains(out.String(), tc.want) || v.agree() != tc.agree || (tc.agree && strings.Contains(out.String(), "SKEW")) {
				t.Errorf("agree %v, printed\n%s\nwant %q, agree %v", v.agree(), out.String(), tc.want, tc.agree)
			}
		})
	}
}
