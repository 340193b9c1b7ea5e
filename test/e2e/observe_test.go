package e2e

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/observe/graph"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// seeTheFederation checks what an operator sees of a live federation
// (docs/operations.md): `flotilla graph` over every cluster's kubeconfig
// has every cluster, reported, and every pair linked and Connected both
// ways with traffic counted; a's dashboard names every peer, Connected.
func seeTheFederation(t *testing.T, cs []*federation.NodeCluster) {
	t.Helper()
	t.Run("flotilla graph shows every cluster and every link, both sides Connected", func(t *testing.T) {
		args := []string{"graph", "--format", "json"}
		for _, c := range cs {
			args = append(args, "--kubeconfig", c.CP.Kubeconfig)
		}
		cmd := exec.Command(harness.Flotilla(t), args...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("flotilla %s: %v: %s", strings.Join(args, " "), err, out)
		}
		var g graph.Graph
		if err := json.Unmarshal(out, &g); err != nil {
			t.Fatalf("flotilla graph --format json: %v\n%s", err, out)
		}
		names := map[string]bool{}
		for _, cl := range g.Clusters {
			if !cl.Reported {
				t.Errorf("cluster %s (%s): not reported, though its kubeconfig was given", cl.Name, cl.ID)
			}
			names[cl.Name] = true
		}
		for _, c := range cs {
			if !names[c.Name] {
				t.Errorf("graph clusters %v: %s missing", names, c.Name)
			}
		}
		if want := len(cs) * (len(cs) - 1) / 2; len(g.Links) != want {
			t.Errorf("%d links, want %d (every pair)", len(g.Links), want)
		}
		for _, l := range g.Links {
			for side, v := range map[string]*graph.View{l.A + " sees " + l.B: l.AB, l.B + " sees " + l.A: l.BA} {
				switch {
				case v == nil:
					t.Errorf("link %s: no report", side)
				case v.Phase != string(v1alpha1.PhaseConnected):
					t.Errorf("link %s: phase %q, want Connected", side, v.Phase)
				case v.ReceiveBytes == nil || *v.ReceiveBytes == 0:
					t.Errorf("link %s: received bytes %v, want the tunnel's counter, above 0", side, v.ReceiveBytes)
				}
			}
		}
	})
	t.Run("the dashboard names every peer, Connected", func(t *testing.T) {
		a := cs[0]
		page, status, err := agentGet(a, "/")
		if err != nil || status != http.StatusOK {
			t.Fatalf("%s's dashboard: %d %v", a.Name, status, err)
		}
		for _, c := range cs[1:] {
			if !strings.Contains(page, c.Name) {
				t.Errorf("%s's dashboard does not name %s", a.Name, c.Name)
			}
		}
		if n := strings.Count(page, string(v1alpha1.PhaseConnected)); n < len(cs)-1 {
			t.Errorf("%s's dashboard says Connected %d times, want at least once per peer (%d)", a.Name, n, len(cs)-1)
		}
		if !strings.Contains(page, "<svg") {
			t.Errorf("%s's dashboard has no picture of the federation", a.Name)
		}
	})
}
