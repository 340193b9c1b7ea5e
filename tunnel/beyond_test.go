package tunnel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// A peer reaches my networks through the tunnel, and nothing else: not my
// gateway host's other addresses, not my node network, not what lies
// beyond it. WireGuard checks only the source of what a peer sends, so a
// peer that routes any destination into its tunnel (its agent
// compromised, its WireGuard edited by hand) would otherwise have my
// gateway forward it: to a host of my node network, to a cloud's metadata
// address, to the internet. Here b, Full, puts a host x of a's LAN into
// its allowed IPs for a and sends to x and to an address of a's gateway
// host outside a's networks, from an address of its own range; neither may arrive, and a's guard must count them (the
// witness that they came out of a's tunnel), in the table and in
// flotilla_tunnel_beyond_dropped_packets_total. b's own pod still
// reaches a's pod.
func TestPeerReachesOnlyMyNetworks(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.1.0.0/16")
	a, b := m.sites[0], m.sites[1]
	x := m.env.NewSite("x", harness.SiteOptions{LAN: m.lan})
	m.start(a)
	m.start(b, "-watch=false") // keeps the hand-edited allowed IPs
	m.apply(a, m.desiredFor(a, b))
	m.apply(b, m.desiredFor(b, a))
	waitUntil(t, 15*time.Second, "b's pod reaches a's pod", func() bool { return b.pod.Ping(b.seenFrom(a)) == nil })

	own := hostIn(b.PodCIDR, 0, 77) // a sees b's range as it is
	b.exec(t, "ip", "addr", "add", own.String()+"/32", "dev", "lo")
	const aHost = "192.0.2.1" // an address of a's gateway host, none of a's networks
	a.exec(t, "ip", "addr", "add", aHost+"/32", "dev", "lo")
	b.exec(t, "wg", "set", b.ifname, "peer", a.pub.String(), "allowed-ips", fmt.Sprintf("%s,%s/32,%s/32", b.views[a.name], x.Addr, aHost))
	for _, dst := range []string{x.Addr.String(), aHost} {
		b.exec(t, "ip", "route", "add", dst+"/32", "dev", b.ifname, "src", own.String())
	}
	x.MustExec("nft", "add table ip watch; add chain ip watch in { type filter hook prerouting priority -300; }; "+
		fmt.Sprintf(`add rule ip watch in ip saddr %s counter comment "from b"`, own))
	a.exec(t, "nft", "add table ip watch; add chain ip watch in { type filter hook input priority 300; }; "+
		fmt.Sprintf(`add rule ip watch in ip saddr %s counter comment "from b"`, own))

	for _, dst := range []string{x.Addr.String(), aHost} {
		if out, err := b.Exec(context.Background(), "ping", "-n", "-c", "3", "-i", "0.2", "-W", "1", "-I", own.String(), dst); err == nil {
			t.Errorf("b reached %s through a's tunnel:\n%s", dst, out)
		}
	}
	if n := harness.NFTCounter(t, x.MustExec("nft", "list", "table", "ip", "watch"), "from b"); n != 0 {
		t.Errorf("%d of b's packets reached x, a host of a's LAN, through a's tunnel", n)
	}
	if n := harness.NFTCounter(t, a.exec(t, "nft", "list", "table", "ip", "watch"), "from b"); n != 0 {
		t.Errorf("%d of b's packets reached a's gateway host at %s through the tunnel", n, aHost)
	}
	if n := harness.NFTCounter(t, a.exec(t, "nft", "list", "table", "ip", "flotilla"), tunnel.BeyondComment); n < 6 {
		t.Errorf("a's guard counted %d packets, want the 6 b sent: they did not come out of a's tunnel", n)
	}
	waitCounter(t, a, "flotilla_tunnel_beyond_dropped_packets_total", 6)
	if err := b.pod.Ping(b.seenFrom(a)); err != nil {
		t.Errorf("b's pod to a's pod after: %v", err)
	}
}

// waitCounter waits until the site's tunnel process reports its counter
// name (one without labels) at least at least.
func waitCounter(t *testing.T, s *meshSite, name string, least float64) {
	t.Helper()
	var got map[string]float64
	waitUntil(t, 5*time.Second, fmt.Sprintf("%s's %s at %v at least", s.name, name, least), func() bool {
		b, err := os.ReadFile(s.desired + ".metrics")
		return err == nil && json.Unmarshal(b, &got) == nil && got[name] >= least
	})
}
