package fabric_test

import (
	"fmt"
	"testing"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Traffic to a view leaves the gateway node through the tunnel or not at
// all. While the gateway has no route of the tunnel's for a view (a
// replica taking over before its data path is up, or a fenced one after
// it removed it), the node's default route would otherwise carry a pod's
// packets for another cluster out onto the node network, in the clear,
// to whatever router it names. Here the gateway's default route points at
// an upstream router that counts what reaches it for the view; the
// tunnel's route is deleted, the worker's pod dials the peer: nothing
// may reach the router, and the gateway's guard must have counted the
// packets (the witness that they reached the gateway), as its metric
// says too; a worker, which has no guard, shows no such metric.
func TestViewLeavesGatewayOnlyThroughTheTunnel(t *testing.T) {
	c := newCluster(t)
	up := c.env.NewSite("up", harness.SiteOptions{LAN: c.lan})
	c.gw.MustExec("ip", "route", "replace", "default", "via", up.Addr.String())
	up.MustExec("nft", fmt.Sprintf("add table ip watch; add chain ip watch in { type filter hook prerouting priority -300; }; "+
		`add rule ip watch in ip daddr %s counter comment "leaked"`, view))
	gwLogs, gwReg := c.withLogs(t, c.gw)
	wkLogs, wkReg := c.withLogs(t, c.wk)
	c.applyBoth(t)
	runIn(t, c.gw, c.fabrics[c.gw], gwLogs)
	runIn(t, c.wk, c.fabrics[c.wk], wkLogs)
	c.podAndPeerTalk(t, "with the tunnel's route")
	for _, hook := range []string{"forward", "output"} {
		if v, ok := metricValue(t, gwReg, guardMetric, "hook", hook); !ok || v != 0 {
			t.Errorf("gateway: %s{hook=%q} = %v (present %v), want 0 while the tunnel has its route", guardMetric, hook, v, ok)
		}
	}
	if _, ok := metricValue(t, wkReg, guardMetric); ok {
		t.Errorf("worker: %s shown, but a worker has no guard", guardMetric)
	}

	c.gw.MustExec("ip", "route", "del", view.String(), "via", "169.254.9.2")
	if from, err := c.seen(peerAddr); err == nil {
		t.Fatalf("the pod reached the peer (seen as %s) with the tunnel's route gone", from)
	}
	if n := harness.NFTCounter(t, up.MustExec("nft", "list", "table", "ip", "watch"), "leaked"); n != 0 {
		t.Errorf("%d packets for the view %s left the gateway by its default route", n, view)
	}
	n := harness.NFTCounter(t, c.gw.MustExec("nft", "list", "table", "ip", fabric.DefaultNFTable), fabric.GuardComment)
	if n == 0 {
		t.Errorf("the gateway's guard counted nothing: the pod's packets did not reach the gateway")
	}
	if v, _ := metricValue(t, gwReg, guardMetric, "hook", "forward"); v < float64(n) {
		t.Errorf("gateway: %s{hook=\"forward\"} = %v, want at least the %d packets the guard's rule counted", guardMetric, v, n)
	}
}

const guardMetric = "flotilla_fabric_guard_dropped_packets_total"
