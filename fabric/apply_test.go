package fabric_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernelChanges records, in a node's namespace, the route events of our
// table and the nftables changes, until a marker shows that every event
// of what came before has been read.
type kernelChanges struct {
	routes []string // "+dst" or "-dst"
	nft    []string // kind of object changed, "+element"/"-element" per element
}

// watch starts recording; the returned function makes a marker change,
// waits for it, and returns what was recorded before it.
func watch(t *testing.T, s *harness.Site) func() kernelChanges {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	h := s.Handle()
	routes := make(chan netlink.RouteUpdate, 1024)
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(h)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseLasting() })
	mon := nftables.NewMonitor(nftables.WithMonitorObject(nftables.MonitorObjectAny), nftables.WithMonitorEventBuffer(1024))
	nftEvents, err := conn.AddMonitor(mon)
	if err != nil {
		t.Fatal(err)
	}
	const marker = "10.201.0.0/16"
	return func() kernelChanges {
		t.Helper()
		var k kernelChanges
		s.MustExec("ip", "route", "add", marker, "dev", "lo", "table", "300")
		s.MustExec("nft", "add", "table", "ip", "marker")
		defer s.MustExec("ip", "route", "del", marker, "dev", "lo", "table", "300")
		defer s.MustExec("nft", "delete", "table", "ip", "marker")
		timeout := time.After(10 * time.Second)
		for {
			select {
			case u := <-routes:
				if u.Table == 300 {
					if u.Type == unix.RTM_NEWROUTE {
						goto nft
					}
					continue
				}
				if u.Table != fabric.DefaultTable {
					continue
				}
				sign := "+"
				if u.Type == unix.RTM_DELROUTE {
					sign = "-"
				}
				k.routes = append(k.routes, sign+u.Dst.String())
			case <-timeout:
				t.Fatal("marker route event did not come")
			}
		}
	nft:
		for {
			select {
			case ev := <-nftEvents:
				if ev.Error != nil {
					t.Fatalf("nftables monitor: %v", ev.Error)
				}
				switch d := ev.Data.(type) {
				case *nftables.Table:
					if d.Name == "marker" {
						if ev.Type == nftables.MonitorEventTypeNewTable {
							return k
						}
						continue
					}
					k.nft = append(k.nft, "table")
				case *nftables.Chain:
					k.nft = append(k.nft, "chain")
				case *nftables.Rule:
					k.nft = append(k.nft, "rule")
				case *nftables.Set:
					k.nft = append(k.nft, "set")
				case []nftables.SetElement:
					sign := "+"
					if ev.Type == nftables.MonitorEventTypeDelSetElem {
						sign = "-"
					}
					for range d {
						k.nft = append(k.nft, sign+"element")
					}
				}
			case <-timeout:
				t.Fatal("marker nftables event did not come")
			}
		}
	}
}

// An Apply with a changed Desired changes only the difference: one view
// replaced by another is one route deleted and one added, and two set
// elements (start and end) out and two in; nothing else is rewritten. An
// Apply of the same state changes nothing.
func TestApplyChangesOnlyTheDifference(t *testing.T) {
	c := newCluster(t)
	p := netip.MustParsePrefix
	d := c.workerDesired()
	d.Views = []netip.Prefix{view, p("10.72.0.0/16"), p("10.73.0.0/16")}
	c.apply(t, c.wk, d)
	changed := watch(t, c.wk)

	c.apply(t, c.wk, d)
	if k := changed(); len(k.routes)+len(k.nft) != 0 {
		t.Errorf("apply of the same state changed %v %v, want nothing", k.routes, k.nft)
	}

	d.Views = []netip.Prefix{view, p("10.73.0.0/16"), p("10.74.0.0/16")}
	c.apply(t, c.wk, d)
	k := changed()
	slices.Sort(k.routes)
	slices.Sort(k.nft)
	if want := []string{"+10.74.0.0/16", "-10.72.0.0/16"}; !slices.Equal(k.routes, want) {
		t.Errorf("route changes in table %d: %v, want %v", fabric.DefaultTable, k.routes, want)
	}
	if want := []string{"+element", "+element", "-element", "-element"}; !slices.Equal(k.nft, want) {
		t.Errorf("nftables changes: %v, want %v", k.nft, want)
	}
	out := c.wk.MustExec("nft", "list", "set", "ip", fabric.DefaultNFTable, "views")
	if !strings.Contains(out, "10.70.0.0/16") || !strings.Contains(out, "10.73.0.0/16") || !strings.Contains(out, "10.74.0.0/16") || strings.Contains(out, "10.72.") {
		t.Errorf("views set after the change, want 10.70.0.0/16, 10.73.0.0/16, 10.74.0.0/16:\n%s", out)
	}

	// The MTU changes every route in place: replaced, not deleted.
	d.MTU = 1380
	c.apply(t, c.wk, d)
	k = changed()
	if len(k.routes) != 3 || strings.Contains(fmt.Sprint(k.routes), "-") || len(k.nft) != 0 {
		t.Errorf("changes for a new MTU: %v %v, want the 3 routes replaced and nothing else", k.routes, k.nft)
	}
	if out := c.wk.MustExec("ip", "route", "show", "table", fmt.Sprint(fabric.DefaultTable)); strings.Count(out, "mtu 1380") != 3 {
		t.Errorf("routes after the MTU change:\n%s", out)
	}
}

// Remove takes away every route, rule and nftables table of ours, on
// both roles, and leaves every foreign one: a route in our table with
// another protocol, a route with our protocol in main, rules with
// another protocol, and another nftables table.
func TestRemoveLeavesOnlyForeign(t *testing.T) {
	c := newCluster(t)
	table := fmt.Sprint(fabric.DefaultTable)
	for _, s := range []*harness.Site{c.wk, c.gw} {
		s.MustExec("ip", "route", "add", "10.99.0.0/16", "dev", "lan0", "table", table, "proto", "static")
		s.MustExec("ip", "route", "add", "10.98.0.0/16", "dev", "lan0", "proto", "102")
		s.MustExec("ip", "rule", "add", "priority", "20000", "lookup", "200")
		s.MustExec("ip", "rule", "add", "priority", "20001", "lookup", table)
		s.MustExec("nft", "add", "table", "ip", "cni")
		s.MustExec("nft", "add", "chain", "ip", "cni", "post", "{ type nat hook postrouting priority srcnat; }")
	}
	foreign := map[*harness.Site]string{c.wk: state(c.wk), c.gw: state(c.gw)}
	c.applyBoth(t)
	if _, err := c.seen(peerAddr); err != nil {
		t.Fatalf("pod to the peer with the fabric: %v", err)
	}
	for _, s := range []*harness.Site{c.wk, c.gw} {
		if state(s) == foreign[s] {
			t.Fatalf("%s: apply made nothing", s.SiteName)
		}
		remove(t, s)
		if after := state(s); after != foreign[s] {
			t.Errorf("%s after Remove:\n%s\nwant exactly what was there before the fabric:\n%s", s.SiteName, after, foreign[s])
		}
		remove(t, s) // again: nothing left to remove is not an error
	}
}
