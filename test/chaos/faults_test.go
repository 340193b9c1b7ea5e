package chaos_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// fault is one kind of fault: inject breaks victim and returns when the
// fault is healed (the agent restarted, the link plugged back, the space
// freed), with the number of invariants broken while it was on.
type fault struct {
	name string
	// prepare, when set, readies the victim before the traffic starts
	// (gateway-kill's standby replica).
	prepare func(t *testing.T, f *fed, victim *federation.Cluster)
	inject  func(t *testing.T, f *fed, victim *federation.Cluster) int
}

// The order is the draws': seed 1's three faults (make test) are
// gateway-kill, kill-restart and kill-mid-grant.
var faults = []fault{
	{name: "kill-restart", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		// SIGKILL: no goodbye, nothing flushed; restarted on its state dir.
		v.Agent.Kill()
		<-v.Agent.Done()
		v.StartAgent(t)
		return 0
	}},
	{name: "restart-wiped", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		// The state directory lost with the disk, and its snapshot with
		// it: the cluster comes back with a new ledger, so a new identity
		// and WireGuard key (a new member to the others), and no memory
		// of its views' quarantine.
		v.Agent.Kill()
		<-v.Agent.Done()
		wipe(t, v)
		f.inv.newLedger(v)
		v.StartAgent(t)
		return 0
	}},
	{name: "partition-short", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		f.afterHeal = offloadKept(t, f.pairs)
		f.partition(t, v, grace/2)
		return 0
	}},
	{name: "partition-long", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		f.afterHeal = offloadKept(t, f.pairs)
		f.partition(t, v, grace+5*time.Second)
		return 0
	}},
	{name: "control-plane-restart", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		// The API server gone for longer than the grace: the tunnels do
		// not depend on it, so the victim's pod keeps reaching every
		// peer's meanwhile; its agent converges once it is back.
		dsts := viewsFrom(t, f.cs, v)
		v.CP.StopAPIServer()
		time.Sleep(grace)
		broken := 0
		for name, dst := range dsts {
			if err := v.Pod.Ping(dst); err != nil {
				t.Errorf("%s's pod to %s's (%s) while its API server is down: %v", v.Name, name, dst, err)
				broken++
			}
		}
		if exited, err := v.Agent.Exited(); exited {
			t.Errorf("agent of %s exited while its API server was down: %v\n%s", v.Name, err, v.Agent.Tail(20))
			broken++
		}
		if err := v.CP.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		return broken
	}},
	{name: "disk-full", inject: diskFull},
	{name: "gateway-kill", prepare: prepareGatewayKill, inject: killActiveGateway},
	{name: "clock-skew", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		// The victim's clock minutes off, ahead or behind in turn, then
		// put right: both are restarts (the skew is read at start), and
		// putting it right steps the clock the other way.
		f.skews++
		skew := "+5m"
		if f.skews%2 == 0 {
			skew = "-5m"
		}
		v.Agent.Kill()
		<-v.Agent.Done()
		v.Agent = v.Site.Start("agent-"+v.Name, append([]string{"env", "FLOTILLA_CLOCK_SKEW=" + skew, v.Bin}, v.Args...)...)
		waitReady(t, v, 2*time.Minute)
		waitConnected(t, f.cs, 2*time.Minute)
		t.Logf("%s Connected with its clock %s off", v.Name, skew)
		v.Agent.Kill()
		<-v.Agent.Done()
		v.StartAgent(t)
		return 0
	}},
	{name: "kill-mid-grant", inject: killMidGrant},
	{name: "kill-mid-negotiation", inject: func(t *testing.T, f *fed, v *federation.Cluster) int {
		// A new member (v back under a new identity), and the agent of
		// the next cluster SIGKILLed as soon as its Peer of the newcomer
		// shows, mid-negotiation; restarted at once on its state.
		old := identityOf(t, v)
		v.Agent.Kill()
		<-v.Agent.Done()
		wipe(t, v)
		f.inv.newLedger(v)
		v.StartAgent(t)
		o := f.cs[(slices.Index(f.cs, v)+1)%len(f.cs)]
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if id := identityOf(t, v); id != old {
				if _, err := peerOf(o, id); err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s has no Peer of %s's new identity after 2m", o.Name, v.Name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		o.Agent.Kill()
		<-o.Agent.Done()
		t.Logf("%s's agent killed as its Peer of %s's new identity showed", o.Name, v.Name)
		o.StartAgent(t)
		return 0
	}},
	{name: "kill-mid-offload", inject: killMidOffload},
}

// viewsFrom is, by cluster name, how v addresses every other cluster's
// pod, read from v's Peers while its API server serves.
func viewsFrom(t *testing.T, cs []*federation.Cluster, v *federation.Cluster) map[string]netip.Addr {
	t.Helper()
	out := map[string]netip.Addr{}
	for _, o := range cs {
		if o != v {
			out[o.Name] = federation.ViewOf(t, v, o, o.Pod.Addr)
		}
	}
	return out
}

// stateDiskSize is the tmpfs each agent's state directory is mounted on,
// so that disk-full can fill it: ample for a ledger.
const stateDiskSize = "16m"

// mountStateDisks puts every cluster's state directory on a tmpfs of its
// own, unmounted when the test ends (after the agents stopped: their
// cleanups were registered later, so run earlier).
func mountStateDisks(t *testing.T, cs []*federation.Cluster) {
	t.Helper()
	for _, c := range cs {
		harness.SmallDisk(t, c.StateDir, stateDiskSize)
	}
}

// wipe empties c's state directory, a mount point that stays, and
// deletes its ledger's snapshot: the cluster's state is lost.
func wipe(t *testing.T, c *federation.Cluster) {
	t.Helper()
	if err := c.DeleteLedgerSnapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	dir := c.StateDir
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

type fed struct {
	lan *harness.LAN
	cs  []*federation.Cluster
	inv *invariants
	// skews counts clock-skew faults, whose sign alternates.
	skews int
	// pairs offload a workload, consumer to provider.
	pairs []*pair
	// grants counts kill-mid-grant faults: the side killed alternates.
	grants int
	// afterHeal, when a fault sets it, checks more once the offloaded
	// pods settled after it, and returns the invariants broken.
	afterHeal func(t *testing.T) int
	// gateway is gateway-kill's standby, from its prepare to its inject.
	gateway *gatewayKill
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
