package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// peerFacts is what a cluster's Peers say of the others, by Peer name
// (the peer's cluster ID): its WireGuard key and the views both ways.
func peerFacts(t *testing.T, c *federation.Cluster) map[string]string {
	t.Helper()
	var list v1alpha1.PeerList
	if err := c.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		var views []string
		for _, v := range p.Status.TheirNetworks {
			views = append(views, "theirs "+v.Range+"=>"+v.As)
		}
		for _, v := range p.Status.MyNetworks {
			views = append(views, "mine "+v.Range+"=>"+v.As)
		}
		slices.Sort(views)
		out[p.Name] = p.Status.PublicKey + " " + strings.Join(views, ",")
	}
	return out
}

// An agent whose state directory is wiped comes back from the snapshot
// of its ledger in the Secret flotilla-ledger: the same cluster ID and
// WireGuard key to its peer, the same views both ways, and pods talk.
// Both clusters use the same pod range, so the views are remapped ones
// the ledger chose.
func TestWipedStateDirComesBackFromItsSnapshot(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16", "10.0.0.0/16"}})
	a, b := cs[0], cs[1]
	federation.Connect(t, cs)
	federation.AllPairsTalk(t, cs)
	before := map[string]map[string]string{a.Name: peerFacts(t, a), b.Name: peerFacts(t, b)}

	// The snapshot holds everything a's ledger committed.
	eventually.Within(t, 30*time.Second, "a's snapshot at its ledger's generation", a.SnapshotCurrent)

	a.Agent.Kill()
	<-a.Agent.Done()
	entries, err := os.ReadDir(a.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(a.StateDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	a.StartAgent(t)
	eventually.Within(t, 60*time.Second, "a's new agent restored its ledger", func() error {
		if !strings.Contains(a.Agent.Log(), "ledger restored from its snapshot") {
			return fmt.Errorf("not yet; log:\n%s", a.Agent.Tail(5))
		}
		return nil
	})
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
	federation.AllPairsTalk(t, cs)
	for _, c := range cs {
		if got, want := peerFacts(t, c), before[c.Name]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s's Peers after a's state came back from its snapshot:\n  %v\nbefore:\n  %v", c.Name, got, want)
		}
	}
}
