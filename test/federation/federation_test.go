package federation_test

import (
	"os"
	"testing"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Every cluster's site reaches every other cluster's API server at the
// URL its agent would announce, over TLS verified with the CA it would
// send; routed sites have no such URL.
func TestAPIServersOnLAN(t *testing.T) {
	harness.Require(t, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	env := harness.New(t)
	// No agent is started: the binary is never built.
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16", "10.0.0.0/16"}, Flotilla: "unused"})
	for _, from := range cs {
		for _, to := range cs {
			if from == to {
				continue
			}
			if to.APIServerURL == "" || to.APIServerCA == "" {
				t.Fatalf("cluster %s: no API server URL (%q) or CA (%q)", to.Name, to.APIServerURL, to.APIServerCA)
			}
			ca, err := os.ReadFile(to.APIServerCA)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := from.Site.APIServerVersion(to.APIServerURL, ca); err != nil {
				t.Errorf("%s's site to %s's API server: %v", from.Name, to.Name, err)
			}
		}
	}
}
