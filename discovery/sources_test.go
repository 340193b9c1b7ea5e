package discovery

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
)

// A member's sources say what found it and follow the candidates: a named
// seed, DNS-SD while its answer lasts, and gossip when only other members
// told of it. Subscribers hear of every change.
func TestMemberSourcesFollowCandidates(t *testing.T) {
	b := startNode(t, nodeOpts{})
	c := startNode(t, nodeOpts{seeds: []string{b.addr()}})
	waitUntil(t, 20*time.Second, func() error { return sees(b, c) })
	z := startZoneServer(t, nil)
	_, bPort, _ := net.SplitHostPort(b.addr())
	// A named seed: matched to b by what the name resolves to.
	a := startNode(t, nodeOpts{seeds: []string{"localhost:" + bPort}, domains: []string{"fed.test"}, dns: z.addr})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := a.d.Subscribe(ctx)

	hasSources := func(n *testNode, want ...Source) error {
		m, ok := memberOf(a, n.id.ClusterID())
		if !ok || m.State != StateAlive || !slices.Equal(m.Sources, want) {
			return fmt.Errorf("%s on a: %s %v, want alive from %v", n.id.ClusterID(), m.State, m.Sources, want)
		}
		return nil
	}
	// heard waits for an event of c carrying want.
	heard := func(want ...Source) {
		t.Helper()
		for {
			ev := nextEvent(t, events, c.id.ClusterID(), 20*time.Second)
			if ev.Kind != Leave && ev.Kind != Failed && slices.Equal(ev.Member.Sources, want) {
				return
			}
		}
	}
	waitUntil(t, 20*time.Second, func() error { return hasSources(b, SourceSeed) })
	waitUntil(t, 20*time.Second, func() error { return hasSources(c, SourceGossip) })
	heard(SourceGossip)

	_, cPort, _ := net.SplitHostPort(c.addr())
	svc := "_flotilla._udp.fed.test."
	z.set(t, []string{
		svc + " 60 IN SRV 0 0 " + cPort + " c.fed.test.",
		"c.fed.test. 60 IN A 127.0.0.1",
	})
	waitUntil(t, 20*time.Second, func() error { return hasSources(c, SourceDNS) })
	heard(SourceDNS)

	z.set(t, nil) // the answer is not renewed and expires
	waitUntil(t, 20*time.Second, func() error { return hasSources(c, SourceGossip) })
	heard(SourceGossip)
	if err := hasSources(b, SourceSeed); err != nil {
		t.Error(err)
	}
}
