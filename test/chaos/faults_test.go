package chaos_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// fault is one kind of fault: inject breaks victim and returns when the
// fault is healed (the agent restarted, the link plugged back).
type fault struct {
	name   string
	inject func(t *testing.T, f *fed, victim *federation.Cluster)
}

var faults = []fault{
	{"kill-restart", func(t *testing.T, f *fed, v *federation.Cluster) {
		// SIGKILL: no goodbye, nothing flushed; restarted on its state dir.
		v.Agent.Kill()
		<-v.Agent.Done()
		v.StartAgent(t)
	}},
	{"restart-wiped", func(t *testing.T, f *fed, v *federation.Cluster) {
		// The state directory lost with the disk: the cluster comes back
		// with a new ledger, so a new identity and WireGuard key (a new
		// member to the others), and no memory of its views' quarantine.
		v.Agent.Kill()
		<-v.Agent.Done()
		if err := os.RemoveAll(v.StateDir); err != nil {
			t.Fatal(err)
		}
		f.inv.newLedger(v)
		v.StartAgent(t)
	}},
	{"partition-short", func(t *testing.T, f *fed, v *federation.Cluster) {
		f.partition(t, v, grace/2)
	}},
	{"partition-long", func(t *testing.T, f *fed, v *federation.Cluster) {
		f.partition(t, v, grace+5*time.Second)
	}},
}

type fed struct {
	lan *harness.LAN
	cs  []*federation.Cluster
	inv *invariants
}

// partition cuts v's site from the LAN for d.
func (f *fed) partition(t *testing.T, v *federation.Cluster, d time.Duration) {
	t.Helper()
	if err := f.lan.Cut(v.Site.Addr); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	if err := f.lan.Heal(v.Site.Addr); err != nil {
		t.Fatal(err)
	}
}

// faultKinds are the kinds drawn from: all, or those FLOTILLA_CHAOS_KINDS
// names (comma-separated), to aim a run at one.
func faultKinds(t *testing.T) []fault {
	names := os.Getenv("FLOTILLA_CHAOS_KINDS")
	if names == "" {
		return faults
	}
	var out []fault
	for name := range strings.SplitSeq(names, ",") {
		i := slices.IndexFunc(faults, func(f fault) bool { return f.name == name })
		if i < 0 {
			t.Fatalf("FLOTILLA_CHAOS_KINDS: no fault kind %q", name)
		}
		out = append(out, faults[i])
	}
	return out
}
