package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// closedTunnel sets up a tunnel with one peer in the site and closes it,
// leaving its data path up as the agent does on shutdown.
func closedTunnel(t *testing.T, site *harness.Site, ifname string) {
	t.Helper()
	peerKey, _ := tunnel.GeneratePrivateKey()
	err := site.Do(func() error {
		key, err := tunnel.GeneratePrivateKey()
		if err != nil {
			return err
		}
		tun, err := tunnel.New(tunnel.Config{Interface: ifname, Mode: tunnel.ModeUserspace, PrivateKey: key, ListenPort: 20000 + os.Getpid()%10000 /* below the ephemeral range */})
		if err != nil {
			return err
		}
		defer tun.Close()
		return tun.Apply(context.Background(), tunnel.Desired{
			Networks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
			Peers: []tunnel.Peer{{
				ClusterID: "b", PublicKey: peerKey.PublicKey(),
				Views:     []tunnel.View{{Real: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("10.70.0.0/16")}},
				ViewsOfMe: []tunnel.View{{Real: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix("10.71.0.0/16")}},
			}},
		})
	})
	if err != nil {
		t.Fatalf("set up tunnel: %v", err)
	}
	// Whoever removes the link (the test or the command) removes its socket.
	t.Cleanup(func() { os.Remove("/var/run/wireguard/" + ifname + ".sock") })
}

// cleanupIn runs `flotilla cleanup args...` in the site's namespace.
func cleanupIn(site *harness.Site, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	site.Do(func() error {
		code = run(append([]string{"cleanup"}, args...), &out, &errOut)
		return nil
	})
	return code, out.String(), errOut.String()
}

// After a tunnel closed (leaving its data path up, as on agent shutdown),
// `flotilla cleanup` removes the link, our routes and our nftables table
// (maps and per-peer chains with it), and leaves alone a foreign route, a
// route with our protocol number through another link, and a foreign
// table.
func TestCleanupRemovesTunnelObjects(t *testing.T) {
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2, harness.NFT)
	lan := env.NewLAN("lan")
	site := env.NewSite("a", harness.SiteOptions{LAN: lan, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	ifname := env.LinkName("c")
	site.MustExec("ip", "route", "add", "10.200.0.0/16", "dev", "lan0", "proto", "static")
	site.MustExec("ip", "route", "add", "10.201.0.0/16", "dev", "lan0", "proto", fmt.Sprint(tunnel.DefaultRouteProtocol))
	site.MustExec("nft", "add table ip foreign; add chain ip foreign c { type filter hook forward priority 0; }")
	closedTunnel(t, site, ifname)
	if out := site.MustExec("ip", "route", "show", "dev", ifname, "proto", "102"); !strings.Contains(out, "10.70.0.0/16") {
		t.Fatalf("tunnel route missing before cleanup: %q", out)
	}
	if out := site.MustExec("nft", "list", "table", "ip", "flotilla"); !strings.Contains(out, "jump egress-b") || !strings.Contains(out, "chain ingress-b") {
		t.Fatalf("per-peer NAT chains and maps missing before cleanup:\n%s", out)
	}

	if code, _, stderr := cleanupIn(site, "--wireguard-interface", ifname); code != 0 {
		t.Fatalf("flotilla cleanup exited %d: %s", code, stderr)
	}
	if _, err := site.Exec(context.Background(), "ip", "link", "show", ifname); err == nil {
		t.Errorf("link %s still there", ifname)
	}
	if out := site.MustExec("ip", "route", "show", "10.70.0.0/16"); strings.TrimSpace(out) != "" {
		t.Errorf("our route left: %q", out)
	}
	tables := site.MustExec("nft", "list", "tables")
	if strings.Contains(tables, "flotilla") || !strings.Contains(tables, "foreign") {
		t.Errorf("nftables tables after cleanup: %q, want foreign and not flotilla", tables)
	}
	if out := site.MustExec("ip", "route", "show", "10.200.0.0/16"); !strings.Contains(out, "lan0") {
		t.Errorf("foreign route removed: %q", out)
	}
	if out := site.MustExec("ip", "route", "show", "10.201.0.0/16"); !strings.Contains(out, "lan0") {
		t.Errorf("route with protocol 102 through another link removed: %q", out)
	}
}

// `flotilla cleanup --route-protocol N` with a number of the kernel or a
// routing daemon is refused, says whose it is and what to pass instead,
// and removes nothing: neither routes with that number nor our link.
func TestCleanupRefusesProtocolsOfOthers(t *testing.T) {
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2, harness.NFT)
	lan := env.NewLAN("lan")
	site := env.NewSite("a", harness.SiteOptions{LAN: lan, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	ifname := env.LinkName("c")
	closedTunnel(t, site, ifname)
	for _, tc := range []struct {
		proto int
		owner string
	}{
		{0, "kernel"},
		{2, "kernel"},
		{3, "boot"},
		{12, "BIRD"},
		{16, "DHCP"},
		{18, "keepalived"},
		{42, "Babel"},
		{186, "bgpd"},
		{188, "ospfd"},
		{196, "staticd"},
		{256, "out of range"},
	} {
		t.Run(fmt.Sprint(tc.proto), func(t *testing.T) {
			dst := fmt.Sprintf("10.200.%d.0/24", tc.proto%256)
			if tc.proto > 4 && tc.proto < 256 {
				// A route the daemon would have made, through our own link.
				if _, err := site.Exec(context.Background(), "ip", "route", "add", dst, "dev", ifname, "proto", fmt.Sprint(tc.proto)); err != nil {
					t.Fatal(err)
				}
			}
			code, stdout, stderr := cleanupIn(site, "--wireguard-interface", ifname, "--route-protocol", fmt.Sprint(tc.proto))
			if code == 0 {
				t.Fatalf("cleanup --route-protocol %d succeeded: %s", tc.proto, stdout)
			}
			if !strings.Contains(stderr, tc.owner) || !strings.Contains(stderr, fmt.Sprint(tunnel.DefaultRouteProtocol)) || !strings.Contains(stderr, "nothing removed") {
				t.Errorf("refusal %q: want it to name %q, offer %d and say nothing was removed", stderr, tc.owner, tunnel.DefaultRouteProtocol)
			}
			out, err := site.Exec(context.Background(), "ip", "route", "show", "dev", ifname)
			if err != nil {
				t.Fatalf("link %s gone after a refused cleanup: %v", ifname, err)
			}
			if !strings.Contains(string(out), "10.70.0.0/16") || (tc.proto > 4 && tc.proto < 256 && !strings.Contains(string(out), dst)) {
				t.Errorf("routes through %s after a refused cleanup: %q", ifname, out)
			}
		})
	}
}
