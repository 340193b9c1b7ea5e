package chaos_test

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/federation"
)

// invariants checks what must hold once a fault has healed, and keeps
// what it saw of earlier checks: the views each cluster gave each peer.
type invariants struct {
	// held[c][view] is the last peer c was seen to give view, and when.
	held map[*federation.Cluster]map[netip.Prefix]holder
	// kept counts the views a cluster's new identity took over from its
	// old one (peering/succession.go), each once.
	kept int
}

type holder struct {
	peer, name string
	seen       time.Time
}

func newInvariants() *invariants {
	return &invariants{held: map[*federation.Cluster]map[netip.Prefix]holder{}}
}

// newLedger forgets what c's views were: its state directory is gone, and
// with it the quarantine it kept (docs/reliability.md).
func (inv *invariants) newLedger(c *federation.Cluster) { delete(inv.held, c) }

// check checks, once every pair is Connected again, that no cluster keeps
// a Peer of a member that no longer exists, that pods talk in every
// direction by their views, that inside every cluster the views are
// disjoint from each other and from the cluster's own pods, that no view
// went to another peer inside its quarantine, and that every route of
// ours leads to a current view. It returns the number of invariants
// broken and logs each.
func (inv *invariants) check(t *testing.T, cs []*federation.Cluster) int {
	t.Helper()
	broken := noStalePeers(t, cs, grace+time.Minute)
	federation.AllPairsTalk(t, cs)
	now := time.Now()
	for _, c := range cs {
		var list v1alpha1.PeerList
		if err := c.Client.List(context.Background(), &list); err != nil {
			t.Fatal(err)
		}
		var views []netip.Prefix
		for _, p := range list.Items {
			for _, v := range p.Status.TheirNetworks {
				as, err := netip.ParsePrefix(v.As)
				if err != nil {
					t.Errorf("%s's view of %s: %v", c.Name, p.Status.ClusterName, err)
					broken++
					continue
				}
				views = append(views, as)
				broken += inv.sawView(t, c, p.Name, p.Status.ClusterName, as, now)
			}
		}
		for i, v := range views {
			if v.Overlaps(c.Site.PodCIDR) {
				t.Errorf("%s: view %s overlaps its own pods %s", c.Name, v, c.Site.PodCIDR)
				broken++
			}
			for _, w := range views[i+1:] {
				if v.Overlaps(w) {
					t.Errorf("%s: views %s and %s overlap", c.Name, v, w)
					broken++
				}
			}
		}
		for _, r := range ourRoutes(t, c) {
			if !slices.Contains(views, r) {
				t.Errorf("%s: route %s of ours is no view of a peer (views %v)", c.Name, r, views)
				broken++
			}
		}
	}
	return broken
}

// sawView records that c gives peer (named name) view at now, and reports
// a break when a view overlapping it went to another cluster less than
// the quarantine before. A cluster back under a new identity succeeds its
// old one, same name, same endpoint, and takes its views
// (peering/succession.go): the same cluster, so no break.
func (inv *invariants) sawView(t *testing.T, c *federation.Cluster, peer, name string, view netip.Prefix, now time.Time) int {
	t.Helper()
	held := inv.held[c]
	if held == nil {
		held = map[netip.Prefix]holder{}
		inv.held[c] = held
	}
	broken := 0
	for w, h := range held {
		if w == view && h.peer != peer && h.name == name {
			inv.kept++
		}
		if w.Overlaps(view) && h.peer != peer && h.name != name && now.Sub(h.seen) < ipam.DefaultQuarantine {
			t.Errorf("%s: view %s of %s (%s) overlaps %s, %s's %s ago: reused inside the quarantine", c.Name, view, name, peer, w, h.peer, now.Sub(h.seen).Round(time.Second))
			broken++
		}
	}
	held[view] = holder{peer: peer, name: name, seen: now}
	return broken
}

// noStalePeers waits up to within until no cluster has a Peer but those of
// the other clusters' current identities, and returns how many Peers are
// left without a member (each an invariant broken). A cluster that came
// back with a new identity leaves a Peer of its old one in the others
// until they have given it up (its grace, its views released).
func noStalePeers(t *testing.T, cs []*federation.Cluster, within time.Duration) int {
	t.Helper()
	ids := currentIDs(t, cs)
	deadline := time.Now().Add(within)
	for {
		var stale []string
		for _, c := range cs {
			var list v1alpha1.PeerList
			if err := c.Client.List(context.Background(), &list); err != nil {
				t.Fatal(err)
			}
			for _, p := range list.Items {
				if o, ok := ids[p.Name]; !ok || o == c {
					stale = append(stale, fmt.Sprintf("%s: Peer %s (%s, %s) is no current member", c.Name, p.Name, p.Status.ClusterName, p.Status.Phase))
				}
			}
		}
		if len(stale) == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			for _, s := range stale {
				t.Errorf("%s, %s after the federation converged", s, within)
			}
			return len(stale)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitConnected waits until, in every cluster, the Peer of every other
// cluster's current identity is Connected.
func waitConnected(t *testing.T, cs []*federation.Cluster, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var problems []string
		ids := currentIDs(t, cs)
		for _, c := range cs {
			if exited, err := c.Agent.Exited(); exited {
				t.Fatalf("agent of %s exited: %v\n%s", c.Name, err, c.Agent.Tail(30))
			}
			var list v1alpha1.PeerList
			if err := c.Client.List(context.Background(), &list); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c.Name, err))
				continue
			}
			for id, o := range ids {
				if o == c {
					continue
				}
				i := slices.IndexFunc(list.Items, func(p v1alpha1.Peer) bool { return p.Name == id })
				switch {
				case i < 0:
					problems = append(problems, fmt.Sprintf("%s has no Peer for %s (%s)", c.Name, o.Name, id))
				case list.Items[i].Status.Phase != v1alpha1.PhaseConnected:
					problems = append(problems, fmt.Sprintf("%s sees %s %s", c.Name, o.Name, federation.Describe(list.Items[i])))
				}
			}
		}
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not all Peers Connected after %s:\n  %s", within, strings.Join(problems, "\n  "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var identityLine = regexp.MustCompile(`msg=identity clusterID=(c[a-z2-7]+)`)

// currentIDs maps each cluster's current ID, the last its agent logged,
// to the cluster.
func currentIDs(t *testing.T, cs []*federation.Cluster) map[string]*federation.Cluster {
	t.Helper()
	ids := map[string]*federation.Cluster{}
	for _, c := range cs {
		id := identityOf(t, c)
		if id == "" {
			t.Fatalf("agent of %s logged no identity:\n%s", c.Name, c.Agent.Tail(10))
		}
		ids[id] = c
	}
	return ids
}

// identityOf is the last identity c's agent logged ("" before any).
func identityOf(t *testing.T, c *federation.Cluster) string {
	t.Helper()
	m := identityLine.FindAllStringSubmatch(c.Agent.Log(), -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1]
}

// peerOf reads c's Peer named id.
func peerOf(c *federation.Cluster, id string) (v1alpha1.Peer, error) {
	var p v1alpha1.Peer
	err := c.Client.Get(context.Background(), client.ObjectKey{Name: id}, &p)
	return p, err
}

// ourRoutes lists the destinations of the routes the agent tagged as its
// own (protocol 102) in any table of c's site.
func ourRoutes(t *testing.T, c *federation.Cluster) []netip.Prefix {
	t.Helper()
	out := c.Site.MustExec("ip", "-4", "route", "show", "table", "all", "proto", "102")
	var dsts []netip.Prefix
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		p, err := netip.ParsePrefix(f[0])
		if err != nil {
			a, aerr := netip.ParseAddr(f[0])
			if aerr != nil {
				t.Fatalf("%s: route %q: %v", c.Name, line, err)
			}
			p = netip.PrefixFrom(a, 32)
		}
		dsts = append(dsts, p)
	}
	return dsts
}
