package fabric_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/internal/eventually"
)

// hostSrc is the first address of the worker's block.
var hostSrc = wkBlock.Addr().Next()

// A worker's own traffic to a view leaves with its node address without a
// host source (which no peer can translate), and with the first address
// of its pod block with one: kept as a /32 on lo under our label, set as
// the views' preferred source, answered through the gateway's route to the
// block. Deleted behind its back, the address comes back with its routes;
// zero removes it; Remove leaves nothing and no other address on lo.
func TestWorkerHostReachesPeer(t *testing.T) {
	c := newCluster(t)
	wkLogs, _ := c.withLogs(t, c.wk)
	c.applyBoth(t)
	if from, err := c.wk.TCPExchange(netip.AddrPortFrom(peerAddr, port)); err != nil || from != c.wk.Addr {
		t.Fatalf("worker host to the peer without a host source: seen as %v (%v), want its node address %s", from, err, c.wk.Addr)
	}

	d := c.workerDesired()
	d.HostSource = hostSrc
	c.apply(t, c.wk, d)
	from, err := c.wk.TCPExchange(netip.AddrPortFrom(peerAddr, port))
	if err != nil || from != hostSrc {
		t.Fatalf("worker host to the peer: seen as %v (%v), want %s", from, err, hostSrc)
	}
	if got := hostAddrs(t, c); got != hostSrc.String()+"/32" {
		t.Errorf("lo holds %q as %s, want %s/32", got, fabric.DefaultHostLabel, hostSrc)
	}
	for _, r := range routesOf(t, c.wk) {
		if !r.Src.Equal(hostSrc.AsSlice()) {
			t.Errorf("view route %s has source %v, want %s", r.Dst, r.Src, hostSrc)
		}
	}

	runIn(t, c.wk, c.fabrics[c.wk], wkLogs)
	c.wk.MustExec("ip", "addr", "del", hostSrc.String()+"/32", "dev", "lo")
	eventually.Within(t, 10*time.Second, "the host address and its routes put back", func() error {
		if got := hostAddrs(t, c); got != hostSrc.String()+"/32" {
			return fmt.Errorf("lo holds %q as %s", got, fabric.DefaultHostLabel)
		}
		if rs := routesOf(t, c.wk); len(rs) != 1 || !rs[0].Src.Equal(hostSrc.AsSlice()) {
			return fmt.Errorf("routes %v", rs)
		}
		return nil
	})

	c.apply(t, c.wk, c.workerDesired())
	if got := hostAddrs(t, c); got != "" {
		t.Errorf("without a host source, lo still holds %q as %s", got, fabric.DefaultHostLabel)
	}
	// Someone else's address on lo, even the same one under another
	// label, is not ours.
	c.wk.MustExec("ip", "addr", "add", "10.0.1.200/32", "dev", "lo", "label", "lo:other")
	c.apply(t, c.wk, d)
	// The Fabric's own Remove, as `flotilla fabric` does (Run is still
	// running: it must have nothing to put back).
	if err := c.wk.Do(c.fabrics[c.wk].Remove); err != nil {
		t.Fatal(err)
	}
	if got := hostAddrs(t, c); got != "" {
		t.Errorf("lo holds %q as %s after Remove", got, fabric.DefaultHostLabel)
	}
	if out := c.wk.MustExec("ip", "addr", "show", "dev", "lo"); !strings.Contains(out, "10.0.1.200/32") {
		t.Errorf("Remove took another's address off lo:\n%s", out)
	}
}

// hostAddrs is what lo holds under our label.
func hostAddrs(t *testing.T, c *cluster) string {
	t.Helper()
	var out string
	err := c.wk.Do(func() error {
		l, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if a.Label == fabric.DefaultHostLabel {
				out += a.IPNet.String()
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
