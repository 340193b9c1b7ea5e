package harness_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flotilla-io/flotilla/test/harness"
)

// The CNI masquerade shapes on real nodes, one after the other on one
// cluster of two nodes (gw, w1) and a host outside the pod network on
// their LAN, which routes the pod network via gw (w1 routes it back via
// gw, as a gateway's fabric would):
//   - out: a pod on w1 connects to the outside host, which sees w1's
//     address under every shape;
//   - pods: that pod connects to a pod on gw, which sees its own address;
//   - in: the outside host connects through gw to the pod on w1, which
//     sees gw's address only under flannel's iptables shape (its nftables
//     shape returns before that rule, Calico only translates pool sources).
//
// Without rules every receiver sees the real source: the witness that the
// rules translate, not the network. Removing a shape leaves nothing of it.
func TestMasqueradeShapes(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, append(harness.NeedsNodes, harness.IPTables)...)
	env := harness.New(t)
	cidr := netip.MustParsePrefix("10.0.0.0/16")
	lan := env.NewLAN("lan")
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: cidr, Scheduler: true})
	nodes := cp.StartNodes(harness.NodeOptions{Network: lan}, "gw", "w1")
	gw, w1 := nodes[0], nodes[1]
	outside := env.NewSite("out", harness.SiteOptions{LAN: lan})
	addRoute(t, outside.Netlink(), cidr, gw.Addr)
	addRoute(t, w1.Netlink(), netip.PrefixFrom(outside.Addr, 32), gw.Addr)
	servePeer(t, outside)

	web := runTestServers(t, cp, "web", 2, nil)
	byNode := map[string]string{}
	for _, p := range web {
		byNode[p.Spec.NodeName] = p.Status.PodIP
	}
	var client string // the pod on w1
	for _, p := range web {
		if p.Spec.NodeName == w1.NodeName {
			client = p.Name
		}
	}
	podW1 := netip.MustParseAddr(byNode[w1.NodeName])
	podGW := netip.MustParseAddr(byNode[gw.NodeName])

	for _, tc := range []struct {
		shape   harness.Masquerade
		out, in netip.Addr // what the outside host and the pod on w1 see
	}{
		{harness.NoMasquerade, podW1, outside.Addr},
		{harness.FlannelNFT, w1.Addr, outside.Addr},
		{harness.FlannelIPTables, w1.Addr, gw.Addr},
		{harness.CalicoNFT, w1.Addr, outside.Addr},
		{harness.CalicoIPTables, w1.Addr, outside.Addr},
	} {
		t.Run(tc.shape.String(), func(t *testing.T) {
			for _, n := range nodes {
				if err := n.InstallMasquerade(tc.shape); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				for _, n := range nodes {
					if err := n.RemoveMasquerade(tc.shape); err != nil {
						t.Error(err)
					}
				}
			})
			seen := func(from, url string) netip.Addr {
				t.Helper()
				out, err := kubectlErr("exec", from, "--", "/testserver", "-get", url)(cp)
				if err != nil {
					t.Fatal(err)
				}
				return netip.MustParseAddr(strings.TrimSpace(out))
			}
			if got := seen(client, fmt.Sprintf("http://%s:%d/peer", outside.Addr, harness.TestServerHTTPPort)); got != tc.out {
				t.Errorf("out: the outside host saw the pod on w1 (%s) as %s, want %s", podW1, got, tc.out)
			}
			if got := seen(client, fmt.Sprintf("http://%s:%d/peer", podGW, harness.TestServerHTTPPort)); got != podW1 {
				t.Errorf("pods: the pod on gw saw the pod on w1 (%s) as %s", podW1, got)
			}
			got, err := outside.TCPExchange(netip.AddrPortFrom(podW1, harness.TestServerTCPPort))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.in {
				t.Errorf("in: the pod on w1 saw the outside host (%s), through gw, as %s, want %s", outside.Addr, got, tc.in)
			}
		})
	}

	ours := regexp.MustCompile(`(?i)flannel|cali[-4]|ip calico`)
	for _, n := range nodes {
		out, err := n.Exec(context.Background(), "nft", "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		if m := ours.FindString(string(out)); m != "" {
			t.Errorf("node %s still has %q in its ruleset after every shape was removed:\n%s", n.NodeName, m, out)
		}
		sets, err := n.Netlink().IpsetListAll()
		if err != nil {
			t.Fatalf("ipsets of node %s: %v", n.NodeName, err)
		}
		for _, set := range sets {
			t.Errorf("node %s still has ipset %s after every shape was removed", n.NodeName, set.SetName)
		}
	}
}

// A shape that does not exist is refused, by name.
func TestMasqueradeUnknownShape(t *testing.T) {
	var n harness.Node
	err := n.InstallMasquerade(harness.Masquerade(42))
	if err == nil || !strings.Contains(err.Error(), "Masquerade(42)") {
		t.Fatalf("InstallMasquerade(42): %v, want an error naming the shape", err)
	}
}

func addRoute(t *testing.T, nl *netlink.Handle, dst netip.Prefix, via netip.Addr) {
	t.Helper()
	err := nl.RouteAdd(&netlink.Route{
		Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)},
		Gw:  via.AsSlice(),
	})
	if err != nil {
		t.Fatalf("route %s via %s: %v", dst, via, err)
	}
}

// servePeer answers GET /peer on the test server's HTTP port inside s with
// the address it sees the client as, as the test server does.
func servePeer(t *testing.T, s *harness.Site) {
	t.Helper()
	l, err := s.Listen("tcp", fmt.Sprintf(":%d", harness.TestServerHTTPPort))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintln(w, ap.Addr().Unmap())
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}
