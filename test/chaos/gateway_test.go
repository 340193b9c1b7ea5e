package chaos_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The campaign's clusters have no nodes: a cluster's gateway is a site,
// the network namespace its pod routes through, so it cannot die and
// leave the cluster a gateway. What stands in for the gateway node's
// death: two agent replicas in the site with --leader-elect, each with a
// state directory of its own (its node's disk), and the active one
// SIGKILLed: nothing flushed, the Lease not released, its routes and
// nftables table left as a dead node leaves them. The standby must take
// the Lease and restore the ledger from its snapshot, so that the victim
// keeps its identity and every view. The site's address stays: the
// endpoint's move to another node is TestGatewayFailover's (test/e2e).
//
// The replicas' health and metrics addresses: the standby on the
// campaign's (waitReady reads it once the standby is the agent), the
// active one beside it.
const (
	activeMetrics  = "127.0.0.1:9471"
	standbyMetrics = "127.0.0.1:9470"
)

// gatewayKill is the fault kind's state between its prepare and its
// inject: the standby replica and what the federation was before.
type gatewayKill struct {
	standby *harness.Process
	id      string // the victim's cluster ID
	peers   string // every cluster's Peers (peersOf)
}

// prepareGatewayKill runs the victim as two replicas before the traffic
// starts: its agent SIGKILLed and started again with --leader-elect on
// its state directory, which takes the Lease, and once it is active a
// standby on a fresh directory of its own. It returns once the snapshot
// holds the active ledger's generation and every pair is Connected.
func prepareGatewayKill(t *testing.T, f *fed, v *federation.Cluster) {
	t.Helper()
	dir := standbyDir(v)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	v.Agent.Kill()
	<-v.Agent.Done()
	v.Agent = v.Site.Start("agent-"+v.Name, slices.Concat([]string{v.Bin}, v.Args, []string{"--leader-elect", "--metrics-addr", activeMetrics})...)
	if err := roleWithin(v, v.Agent, activeMetrics, "active", 2*time.Minute); err != nil {
		t.Fatalf("agent of %s restarted with --leader-elect: %v\n%s", v.Name, err, v.Agent.Tail(20))
	}
	standby := v.Site.Start("agent-"+v.Name+"-standby", slices.Concat([]string{v.Bin}, v.Args, []string{"--leader-elect", "--state-dir", dir, "--metrics-addr", standbyMetrics})...)
	if err := roleWithin(v, standby, standbyMetrics, "standby", 2*time.Minute); err != nil {
		t.Fatalf("standby agent of %s: %v\n%s", v.Name, err, standby.Tail(20))
	}
	// A standby taking over then has every change.
	eventually.Within(t, time.Minute, v.Name+"'s ledger snapshot at its ledger's generation", v.SnapshotCurrent)
	waitConnected(t, f.cs, 2*time.Minute)
	f.gateway = &gatewayKill{standby: standby, id: identityOf(t, v), peers: peersOf(t, f.cs)}
	t.Logf("%s runs two replicas: the active one on %s, the standby on %s", v.Name, v.StateDir, dir)
}

// killActiveGateway SIGKILLs the victim's active replica and returns once
// the standby is active and the victim's pod reaches every other pod
// again by its view, printing how long each took. Once the federation
// converged, the check (afterHeal) requires the same identity and the
// same Peers everywhere, then runs the victim as one agent again on its
// own state directory, as the campaign's other faults expect.
func killActiveGateway(t *testing.T, f *fed, v *federation.Cluster) int {
	t.Helper()
	g := f.gateway
	f.gateway = nil
	dsts := viewsFrom(t, f.cs, v)
	killed := time.Now()
	v.Agent.Kill()
	<-v.Agent.Done()
	v.Agent = g.standby
	if err := roleWithin(v, v.Agent, standbyMetrics, "active", 2*time.Minute); err != nil {
		t.Fatalf("standby agent of %s after its active replica was killed: %v\n%s", v.Name, err, v.Agent.Tail(20))
	}
	active := time.Since(killed)
	broken := 0
	deadline := time.Now().Add(time.Minute)
	for name, dst := range dsts {
		for {
			err := v.Pod.Ping(dst)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s's pod to %s's (%s) after %s's standby took over: %v", v.Name, name, dst, v.Name, err)
				broken++
				break
			}
		}
	}
	t.Logf("gateway-kill of %s: the standby active %s after the kill, the victim's pod reached every other pod again %s after it",
		v.Name, active.Round(10*time.Millisecond), time.Since(killed).Round(10*time.Millisecond))
	f.afterHeal = func(t *testing.T) int { return g.check(t, f, v) }
	return broken
}

// check requires that the victim kept its identity and every Peer of
// every cluster is as it was (name, UID, key, views both ways), then
// stops the replica that took over (it releases the Lease and removes its
// data path) and starts the victim's agent without --leader-elect on its
// own state directory, behind the survivor's: it restores the newest
// snapshot if it has to, and must come back as the same cluster.
func (g *gatewayKill) check(t *testing.T, f *fed, v *federation.Cluster) int {
	t.Helper()
	broken := 0
	same := func(when string) {
		if id := identityOf(t, v); id != g.id {
			t.Errorf("%s %s: identity %s, was %s", v.Name, when, id, g.id)
			broken++
		}
		if now := peersOf(t, f.cs); now != g.peers {
			t.Errorf("Peers %s:\n%s\nbefore the kill:\n%s", when, now, g.peers)
			broken++
		}
	}
	same("after the standby took over")
	if err := v.Agent.Stop(); err != nil {
		t.Errorf("stop the replica of %s that took over: %v\n%s", v.Name, err, v.Agent.Tail(20))
		broken++
	}
	v.StartAgent(t)
	waitReady(t, v, 2*time.Minute)
	waitConnected(t, f.cs, 2*time.Minute)
	same("run as one agent again on its own state directory")
	return broken
}

// standbyDir is the state directory of v's standby replica.
func standbyDir(v *federation.Cluster) string { return v.StateDir + "-standby" }

// roleWithin waits until the replica p of c answers /readyz on addr with
// role ("ok: active" once started), or p exits.
func roleWithin(c *federation.Cluster, p *harness.Process, addr, role string, within time.Duration) error {
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DialContext: c.Site.DialContext},
	}
	want := "ok: " + role
	deadline := time.Now().Add(within)
	for {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("exited: %v", err)
		}
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) == want {
				return nil
			}
			err = fmt.Errorf("/readyz answers %s %q, want %q", resp.Status, strings.TrimSpace(string(body)), want)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peersOf is what a gateway's death must not change, per cluster and
// Peer: the Peer (its name, the peer's cluster ID, and UID), the peer's
// WireGuard key, and the views both ways.
func peersOf(t *testing.T, cs []*federation.Cluster) string {
	t.Helper()
	var lines []string
	for _, c := range cs {
		var list v1alpha1.PeerList
		if err := c.Client.List(context.Background(), &list); err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			var views []string
			for _, v := range p.Status.TheirNetworks {
				views = append(views, "theirs "+v.Range+"=>"+v.As)
			}
			for _, v := range p.Status.MyNetworks {
				views = append(views, "mine "+v.Range+"=>"+v.As)
			}
			slices.Sort(views)
			lines = append(lines, fmt.Sprintf("%s: Peer %s (%s, uid %s) key %s %s", c.Name, p.Name, p.Status.ClusterName, p.UID, p.Status.PublicKey, strings.Join(views, ",")))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
