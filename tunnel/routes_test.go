package tunnel_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// onePeer is a desired state with one peer seen as view, which sees my
// 10.0.0.0/24 as 10.71.0.0/24.
func onePeer(t testing.TB, view netip.Prefix) tunnel.Desired {
	t.Helper()
	k, err := tunnel.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return tunnel.Desired{
		Networks: []netip.Prefix{mustPrefix("10.0.0.0/24")},
		Peers: []tunnel.Peer{{
			ClusterID: "b", PublicKey: k.PublicKey(),
			Views:     []tunnel.View{{Real: view, As: view}}, // the peer's network, seen as is
			ViewsOfMe: []tunnel.View{{Real: mustPrefix("10.0.0.0/24"), As: mustPrefix("10.71.0.0/24")}},
		}},
	}
}

// addOtherLink adds a link that is not ours, up, and returns its name. A
// veth pair: this kernel has no dummy links.
func addOtherLink(site *harness.Site) string {
	site.MustExec("ip", "link", "add", "other0", "type", "veth", "peer", "name", "other1")
	site.MustExec("ip", "link", "set", "other0", "up")
	site.MustExec("ip", "link", "set", "other1", "up")
	return "other0"
}

// A route that carries our protocol number in our table but goes through
// another link is not ours: reconcile, the full resync and Cleanup leave
// it alone, and the resync does not count it as a change.
func TestRouteOnAnotherLinkIsNotOurs(t *testing.T) {
	site, tun, cfg := siteTunnel(t, tunnel.Config{})
	other := addOtherLink(site)
	proto := fmt.Sprint(tunnel.DefaultRouteProtocol)
	site.MustExec("ip", "route", "add", "10.123.0.0/16", "dev", other, "proto", proto)
	survives := func(when string) {
		t.Helper()
		if out := site.MustExec("ip", "route", "show", "10.123.0.0/16"); !strings.Contains(out, other) {
			t.Fatalf("route through %s with protocol %s removed by %s: %q", other, proto, when, out)
		}
	}

	if err := site.Do(func() error { return tun.Apply(context.Background(), onePeer(t, mustPrefix("10.70.0.0/16"))) }); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if out := site.MustExec("ip", "route", "show", "10.70.0.0/16"); !strings.Contains(out, cfg.Interface) {
		t.Fatalf("our route missing after apply: %q", out)
	}
	survives("reconcile")

	var changes int
	if err := site.Do(func() (err error) { changes, err = tunnel.Resync(tun); return err }); err != nil {
		t.Fatalf("resync: %v", err)
	}
	survives("resync")
	if changes != 0 {
		t.Errorf("resync with nothing of ours changed made %d changes, want 0 (the other link's route counted as ours?)", changes)
	}

	if err := site.Do(tun.Cleanup); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if _, err := site.Exec(context.Background(), "ip", "link", "show", cfg.Interface); err == nil {
		t.Fatalf("link %s still there after cleanup", cfg.Interface)
	}
	survives("cleanup")
}

// A view whose range another link already routes with our protocol number
// is refused with an error that says so, and that route stays.
func TestViewRoutedThroughAnotherLinkIsRefused(t *testing.T) {
	site, tun, _ := siteTunnel(t, tunnel.Config{})
	other := addOtherLink(site)
	site.MustExec("ip", "route", "add", "10.70.0.0/16", "dev", other, "proto", fmt.Sprint(tunnel.DefaultRouteProtocol))

	err := site.Do(func() error { return tun.Apply(context.Background(), onePeer(t, mustPrefix("10.70.0.0/16"))) })
	if err == nil || !strings.Contains(err.Error(), "not made by us") {
		t.Errorf("apply of a view another link routes: %v, want an error naming the route not made by us", err)
	}
	if out := site.MustExec("ip", "route", "show", "10.70.0.0/16"); !strings.Contains(out, other) {
		t.Errorf("route through %s replaced: %q", other, out)
	}
}
