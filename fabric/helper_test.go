package fabric_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Addresses of the test cluster: nodes' pod blocks inside 10.0.0.0/16,
// one peer's network seen as the view 10.70.0.0/16.
var (
	podNet   = netip.MustParsePrefix("10.0.0.0/16")
	gwBlock  = netip.MustParsePrefix("10.0.0.0/24")
	wkBlock  = netip.MustParsePrefix("10.0.1.0/24")
	podAddr  = netip.MustParseAddr("10.0.1.5")
	view     = netip.MustParsePrefix("10.70.0.0/16")
	peerAddr = netip.MustParseAddr("10.70.0.9") // the remote pod, as this cluster sees it
)

const (
	port       = 7070
	tunnelLink = "wgx" // the stand-in for the gateway's WireGuard link
)

var iptables = harness.Requirement{
	Name:  "iptables (nf_tables backend)",
	Check: func() error { _, err := exec.LookPath("iptables"); return err },
	Fix:   "apt-get install -y --no-install-recommends iptables",
}

// cluster is a gateway node and a worker node on one LAN, a pod behind
// the worker, and behind the gateway's "tunnel" link a peer namespace that
// holds an address in the view, as the remote pod would after the
// tunnel's translation. The gateway routes the view into that link, as
// the tunnel does.
type cluster struct {
	env     *harness.Env
	gw, wk  *harness.Site
	pod     *harness.Pod
	peer    *harness.Site
	lan     *harness.LAN    // the nodes' LAN; nil in a routed cluster
	wan     *harness.Router // the router of a routed cluster
	fabrics map[*harness.Site]*fabric.Fabric
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2, harness.Ping, harness.NFT)
	lan := env.NewLAN("lan")
	c := &cluster{env: env, lan: lan, fabrics: map[*harness.Site]*fabric.Fabric{}}
	c.gw = env.NewSite("gw", harness.SiteOptions{LAN: lan, PodCIDR: gwBlock})
	c.wk = env.NewSite("wk", harness.SiteOptions{LAN: lan, PodCIDR: wkBlock})
	c.pod = c.wk.AddPod("p", podAddr)
	c.addPeer(lan.Prefix)
	return c
}

// newRoutedCluster is newCluster with the gateway and the worker each on
// a segment of their own behind a router: they share no link, so the
// fabric goes through its overlay.
func newRoutedCluster(t testing.TB) *cluster {
	t.Helper()
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2, harness.Ping, harness.NFT)
	wan := env.NewRouter("wan")
	c := &cluster{env: env, wan: wan, fabrics: map[*harness.Site]*fabric.Fabric{}}
	c.gw = env.NewSite("gw", harness.SiteOptions{Router: wan, PodCIDR: gwBlock})
	c.wk = env.NewSite("wk", harness.SiteOptions{Router: wan, PodCIDR: wkBlock})
	c.pod = c.wk.AddPod("p", podAddr)
	c.addPeer(netip.MustParsePrefix("198.19.0.0/16"))
	return c
}

// addPeer puts the peer behind the gateway's "tunnel" link; nodes is the
// node network, which the peer routes back through the gateway.
func (c *cluster) addPeer(nodes netip.Prefix) {
	// The peer sits on a LAN of its own with only the gateway; its
	// "lan0" plays the far end of the tunnel.
	tun := c.env.NewLAN("tun")
	c.peer = c.env.NewSite("peer", harness.SiteOptions{LAN: tun})
	c.gw.MustExec("ip", "link", "add", tunnelLink, "type", "veth", "peer", "name", "wgx-far")
	c.gw.MustExec("ip", "link", "set", "wgx-far", "netns", c.peer.Name)
	c.gw.MustExec("ip", "addr", "add", "169.254.9.1/30", "dev", tunnelLink)
	c.gw.MustExec("ip", "link", "set", tunnelLink, "up")
	c.peer.MustExec("ip", "addr", "add", "169.254.9.2/30", "dev", "wgx-far")
	c.peer.MustExec("ip", "addr", "add", peerAddr.String()+"/32", "dev", "wgx-far")
	c.peer.MustExec("ip", "link", "set", "wgx-far", "up")
	c.peer.MustExec("ip", "route", "add", podNet.String(), "via", "169.254.9.1", "src", peerAddr.String())
	// The node network too, so that a masqueraded connection is answered
	// and a test sees which source address arrived.
	c.peer.MustExec("ip", "route", "add", nodes.String(), "via", "169.254.9.1", "src", peerAddr.String())
	c.gw.MustExec("ip", "route", "add", view.String(), "via", "169.254.9.2")
	c.peer.ServeTCP(port)
}

// fabric returns the Fabric of a node, made on first use; it is removed
// when the test ends.
func (c *cluster) fabric(t testing.TB, s *harness.Site) *fabric.Fabric {
	t.Helper()
	if f := c.fabrics[s]; f != nil {
		return f
	}
	return c.fabricWith(t, s, fabric.Config{})
}

// fabricWith makes the Fabric of a node with cfg; it is removed when the
// test ends.
func (c *cluster) fabricWith(t testing.TB, s *harness.Site, cfg fabric.Config) *fabric.Fabric {
	t.Helper()
	f, err := fabric.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.fabrics[s] = f
	t.Cleanup(func() {
		if err := s.Do(func() error { return fabric.Remove(cfg) }); err != nil {
			t.Errorf("remove fabric on %s: %v", s.SiteName, err)
		}
	})
	return f
}

func (c *cluster) workerDesired() fabric.Desired {
	return fabric.Desired{Role: fabric.Worker, Addr: c.wk.Addr, Gateway: c.gw.Addr, Views: []netip.Prefix{view}, MTU: 1420}
}

func (c *cluster) gatewayDesired() fabric.Desired {
	return fabric.Desired{Role: fabric.Gateway, Addr: c.gw.Addr, Views: []netip.Prefix{view}, TunnelInterface: tunnelLink,
		Nodes: []fabric.Node{{Addr: c.gw.Addr, PodCIDRs: []netip.Prefix{gwBlock}}, {Addr: c.wk.Addr, PodCIDRs: []netip.Prefix{wkBlock}}}}
}

func (c *cluster) apply(t testing.TB, s *harness.Site, d fabric.Desired) {
	t.Helper()
	f := c.fabric(t, s)
	if err := s.Do(func() error { return f.Apply(d) }); err != nil {
		t.Fatalf("apply on %s: %v", s.SiteName, err)
	}
}

func (c *cluster) applyBoth(t testing.TB) {
	t.Helper()
	c.apply(t, c.gw, c.gatewayDesired())
	c.apply(t, c.wk, c.workerDesired())
}

// remove takes the fabric off a node.
func remove(t testing.TB, s *harness.Site) {
	t.Helper()
	if err := s.Do(func() error { return fabric.Remove(fabric.Config{}) }); err != nil {
		t.Fatalf("remove on %s: %v", s.SiteName, err)
	}
}

// podAndPeerTalk checks that the worker's pod and the peer reach each
// other both ways, each seeing the other's own address; how says by what
// path, for the errors. It serves TCP in the pod: call it once per cluster.
func (c *cluster) podAndPeerTalk(t *testing.T, how string) {
	t.Helper()
	from, err := c.seen(peerAddr)
	if err != nil {
		t.Fatalf("pod on the worker to the peer %s: %v", how, err)
	}
	if from != podAddr {
		t.Errorf("peer saw the pod as %s, want its own address %s", from, podAddr)
	}
	c.pod.ServeTCP(port)
	from, err = c.peer.TCPExchange(netip.AddrPortFrom(podAddr, port))
	if err != nil {
		t.Fatalf("peer to the pod on the worker %s: %v", how, err)
	}
	if from != peerAddr {
		t.Errorf("pod saw the peer as %s, want %s", from, peerAddr)
	}
}

// seen connects from the pod to addr and returns the source address the
// server saw.
func (c *cluster) seen(to netip.Addr) (netip.Addr, error) {
	return c.pod.TCPExchange(netip.AddrPortFrom(to, port))
}

// state is what a node shows of the fabric's kinds of objects, for
// comparing before and after.
func state(s *harness.Site) string {
	var b strings.Builder
	for _, cmd := range [][]string{
		// VXLAN links and our link's FDB only: the other links' FDB
		// gains IPv6 multicast entries on its own after they come up.
		{"ip", "-d", "link", "show", "type", "vxlan"},
		{"bridge", "fdb", "show", "dev", fabric.DefaultOverlayLink},
		{"ip", "-4", "-d", "route", "show", "table", "all"},
		{"ip", "-4", "rule", "show"},
		{"nft", "list", "ruleset"},
	} {
		out, err := s.Exec(context.Background(), cmd[0], cmd[1:]...)
		fmt.Fprintf(&b, "$ %s\n%s%v\n", strings.Join(cmd, " "), out, err)
	}
	return b.String()
}
