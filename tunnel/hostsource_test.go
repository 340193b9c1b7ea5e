package tunnel_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/internal/eventually"
)

// The gateway host itself reaches a remote pod by its view, pinging and
// over TCP, and the pod sees it as the peer's view of the host source,
// a CNI's masquerade of the PodCIDR (which holds the host source) in force;
// someone deleting the address gets it and its routes put back; with the
// host source unset again, the link holds no address and no route names
// a source.
func TestGatewayHostReachesRemotePods(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	const port = 7074
	b.pod.ServeTCP(port)
	cniMasquerade(t, a, "nft")
	m.start(a)
	m.start(b)
	hostSource := netip.MustParseAddr("10.0.0.1") // the first address of a's node block 10.0.0.0/24
	d := m.desiredFor(a, b)
	d.HostSource = hostSource
	m.apply(a, d)
	m.apply(b, m.desiredFor(b, a))

	dst := a.seenFrom(b)
	if err := pingEventually(a, b); err != nil { // the tunnel is up
		t.Fatal(err)
	}
	if err := a.Ping(dst); err != nil {
		t.Errorf("gateway a pings pod b as %s: %v", dst, err)
	}
	want := translate(hostSource, a.PodCIDR, b.views["a"])
	var seen netip.Addr
	eventually.Within(t, 10*time.Second, "gateway a's TCP exchange with pod b", func() error {
		var err error
		seen, err = a.TCPExchange(netip.AddrPortFrom(dst, port))
		return err
	})
	if seen != want {
		t.Errorf("pod b sees gateway a as %s, want %s (b's view of host source %s)", seen, want, hostSource)
	}

	// Deleting the address takes the routes naming it with it; the route
	// events bring both back.
	withSource := a.ownedRoutes(t)
	if len(withSource) != 1 || !strings.Contains(withSource[0], " src "+hostSource.String()) {
		t.Fatalf("routes with host source %s: %q, want one naming it as src", hostSource, withSource)
	}
	a.exec(t, "ip", "addr", "del", hostSource.String()+"/32", "dev", a.ifname)
	waitUntil(t, 5*time.Second, "host source and its routes back", func() bool {
		return slices.Equal(a.ownedRoutes(t), withSource) &&
			strings.Contains(a.exec(t, "ip", "-4", "-o", "addr", "show", "dev", a.ifname), hostSource.String()+"/32")
	})
	if seen, err := a.TCPExchange(netip.AddrPortFrom(dst, port)); err != nil || seen != want {
		t.Errorf("after the repair pod b sees gateway a as %s (%v), want %s", seen, err, want)
	}

	m.apply(a, m.desiredFor(a, b))
	if out := strings.TrimSpace(a.exec(t, "ip", "-4", "-o", "addr", "show", "dev", a.ifname)); out != "" {
		t.Errorf("address left on %s with no host source: %s", a.ifname, out)
	}
	routes := a.ownedRoutes(t)
	if len(routes) != 1 {
		t.Errorf("routes with no host source: %q, want the one to %s", routes, a.views["b"])
	}
	for _, r := range routes {
		if strings.Contains(r, " src ") {
			t.Errorf("route with a source with no host source: %s", r)
		}
	}
}
