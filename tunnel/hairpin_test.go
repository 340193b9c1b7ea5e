package tunnel_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// A packet that came out of the tunnel never goes back into it. Two
// clusters that drew the same range from the same pool see each other
// under it (a's view of b is b's view of a); a gateway that lacks its
// translation for b for a moment (a replica taking over has its
// WireGuard peers before its NAT) routes b's packet for a's pod back to
// b, where b's own translation hands it to b's pod at the same address:
// a connection meant for another cluster is answered inside its own. Here
// a's translation for b is deleted by hand (a's tunnel repairs nothing:
// no watch) and b has a pod at the address of a's pod; the connection
// must find no one, and a's guard must have counted the packets it
// dropped (the witness that they reached a), in the table and in
// flotilla_tunnel_hairpin_dropped_packets_total.
func TestNothingForwardedBackIntoTheTunnel(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	b.views[a.name] = a.views[b.name]
	twin := b.AddPod("twin", a.pod.Addr)
	a.pod.ServeTCP(8080)
	twin.ServeTCP(8080)
	m.start(a, "-watch=false")
	m.start(b)
	m.apply(a, m.desiredFor(a, b))
	m.apply(b, m.desiredFor(b, a))

	dst := netip.AddrPortFrom(b.seenFrom(a), 8080)
	waitUntil(t, 15*time.Second, "b's pod reaches a's pod", func() bool {
		ans, err := b.pod.TCPAnswer(dst)
		if err == nil && ans.Host != a.pod.Name {
			t.Fatalf("b's pod -> %s: answered by %s, not a's pod %s", dst, ans.Host, a.pod.Name)
		}
		return err == nil
	})
	before := harness.NFTCounter(t, a.exec(t, "nft", "list", "chain", "ip", "flotilla", "forward"), tunnel.HairpinComment)

	a.exec(t, "nft", "delete", "element", "ip", "flotilla", "ingress-peers", "{ "+a.views[b.name].String()+" }")
	if ans, err := b.pod.TCPAnswer(dst); err == nil {
		t.Fatalf("with a's translation for b gone, b's pod -> %s was answered by %s; want no answer", dst, ans.Host)
	}
	if n := harness.NFTCounter(t, a.exec(t, "nft", "list", "chain", "ip", "flotilla", "forward"), tunnel.HairpinComment); n <= before {
		t.Fatalf("a's guard counted %d packets before and %d after b's connection: b's packets did not reach a's forward hook", before, n)
	}
	waitCounter(t, a, "flotilla_tunnel_hairpin_dropped_packets_total", 1)
}
