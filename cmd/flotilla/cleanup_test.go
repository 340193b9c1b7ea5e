package main

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// After a tunnel closed (leaving its data path up, as on agent shutdown),
// `flotilla cleanup` removes the link, our routes and our nftables table
// (maps and per-peer chains with it), and leaves a foreign route and a
// foreign table alone.
func TestCleanupRemovesTunnelObjects(t *testing.T) {
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2, harness.NFT)
	lan := env.NewLAN("lan")
	site := env.NewSite("a", harness.SiteOptions{LAN: lan, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	ifname := env.LinkName("c")
	site.MustExec("ip", "route", "add", "10.200.0.0/16", "dev", "lan0", "proto", "static")
	site.MustExec("nft", "add table ip foreign; add chain ip foreign c { type filter hook forward priority 0; }")

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
	if out := site.MustExec("ip", "route", "show", "proto", "102"); !strings.Contains(out, "10.70.0.0/16") {
		t.Fatalf("tunnel route missing before cleanup: %q", out)
	}
	if out := site.MustExec("nft", "list", "table", "ip", "flotilla"); !strings.Contains(out, "jump egress-b") || !strings.Contains(out, "chain ingress-b") {
		t.Fatalf("per-peer NAT chains and maps missing before cleanup:\n%s", out)
	}

	var stdout, stderr bytes.Buffer
	var code int
	site.Do(func() error {
		code = run([]string{"cleanup", "--wireguard-interface", ifname}, &stdout, &stderr)
		return nil
	})
	if code != 0 {
		t.Fatalf("flotilla cleanup exited %d: %s", code, stderr.String())
	}
	if _, err := site.Exec(context.Background(), "ip", "link", "show", ifname); err == nil {
		t.Errorf("link %s still there", ifname)
	}
	if out := site.MustExec("ip", "route", "show", "proto", "102"); strings.TrimSpace(out) != "" {
		t.Errorf("routes left: %q", out)
	}
	tables := site.MustExec("nft", "list", "tables")
	if strings.Contains(tables, "flotilla") || !strings.Contains(tables, "foreign") {
		t.Errorf("nftables tables after cleanup: %q, want foreign and not flotilla", tables)
	}
	if out := site.MustExec("ip", "route", "show", "10.200.0.0/16"); !strings.Contains(out, "lan0") {
		t.Errorf("foreign route removed: %q", out)
	}
}
