package chaos_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The message of a write the file system refused for space (ENOSPC), as
// the ledger's errors carry it.
const noSpace = "no space left on device"

// diskFull: the ledger's disk full while the victim must record
// something new: a long partition makes it release its views and, once
// healed, negotiate again; then it is restarted on the full disk, as a
// pod would be. It must say why a write fails, keep its tunnels, start
// and serve on, and once space returns its ledger must hold what it
// held: its identity and a view for every view its Peers show.
func diskFull(t *testing.T, f *fed, v *federation.Cluster) int {
	id := identityOf(t, v)
	from := len(v.Agent.Log())
	filler := harness.FillDisk(t, v.StateDir)
	f.partition(t, v, grace+5*time.Second)
	refused := strings.Contains(v.Agent.Log()[from:], noSpace)
	v.Agent.Kill()
	<-v.Agent.Done()
	v.StartAgent(t)
	broken := 0
	if err := readyWithin(v, 2*time.Minute); err != nil {
		t.Errorf("agent of %s restarted on a full disk: %v\n%s", v.Name, err, v.Agent.Tail(20))
		broken++
	}
	if refused {
		t.Logf("agent of %s had a write refused for space (see its log)", v.Name)
	} else {
		t.Logf("agent of %s had no write refused for space: the ledger's writes fit in the pages its file had", v.Name)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	f.afterHeal = func(t *testing.T) int { return ledgerKept(t, v, id) }
	return broken
}

// ledgerKept checks, once the federation converged after the disk had
// space again, that v kept its identity and that its ledger holds every
// view its Peers show: nothing the agent wrote before or during the fault
// was lost. It returns the number of breaks.
func ledgerKept(t *testing.T, v *federation.Cluster, id string) int {
	t.Helper()
	broken := 0
	if now := identityOf(t, v); now != id {
		t.Errorf("%s came back from a full disk as %s, was %s", v.Name, now, id)
		broken++
	}
	l, err := ipam.OpenSnapshot(filepath.Join(v.StateDir, ipam.FileName))
	if err != nil {
		t.Errorf("%s's ledger after a full disk: %v", v.Name, err)
		return broken + 1
	}
	defer l.Close()
	held := map[string]bool{}
	for _, w := range l.Views("") {
		held[w.Peer+" "+w.View.String()] = true
	}
	var list v1alpha1.PeerList
	if err := v.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	shown := 0
	for _, p := range list.Items {
		for _, n := range p.Status.TheirNetworks {
			as, err := netip.ParsePrefix(n.As)
			if err != nil {
				t.Errorf("%s's view of %s: %v", v.Name, p.Status.ClusterName, err)
				broken++
				continue
			}
			shown++
			if !held[p.Name+" "+as.String()] {
				t.Errorf("%s's Peer %s shows the view %s, which its ledger lacks after the full disk", v.Name, p.Status.ClusterName, as)
				broken++
			}
		}
	}
	if shown == 0 {
		t.Errorf("%s's Peers show no view: nothing to compare its ledger with", v.Name)
		broken++
	}
	t.Logf("%s: identity and %d views kept through the full disk", v.Name, shown)
	return broken
}
