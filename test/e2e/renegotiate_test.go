package e2e

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Any change of a cluster's statement renegotiates: a new WireGuard
// endpoint, a rotated WireGuard key, a new pod range. After each, the
// other side's Peer shows it and traffic flows by the (new) views.
func TestPeeringRenegotiatesOnChange(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3[:2]})
	federation.Connect(t, cs)
	a, b := cs[0], cs[1]
	restart := func(set func(args []string) []string) {
		t.Helper()
		a.Agent.Stop()
		a.Args = set(a.Args)
		a.StartAgent(t)
	}
	peerOfA := func() v1alpha1.Peer {
		t.Helper()
		p, ok := mustPeers(t, b)["a"]
		if !ok {
			t.Fatal("b has no Peer for a")
		}
		return p
	}
	waitForA := func(what string, ok func(p v1alpha1.Peer) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !ok(peerOfA()) {
			if time.Now().After(deadline) {
				t.Fatalf("b never saw a's %s: %+v", what, peerOfA().Status)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("new endpoint", func(t *testing.T) {
		restart(func(args []string) []string { return append(args, "--wireguard-port", "51821") })
		waitForA("new endpoint", func(p v1alpha1.Peer) bool {
			return p.Status.Endpoint == a.Site.Addr.String()+":51821" && p.Status.Phase == v1alpha1.PhaseConnected
		})
		federation.AllPairsTalk(t, cs)
	})

	t.Run("rotated key", func(t *testing.T) {
		before := peerOfA().Status.PublicKey
		restart(func(args []string) []string { return append(args, "--wireguard-key-rotation", "4s") })
		waitForA("rotated key", func(p v1alpha1.Peer) bool {
			return p.Status.PublicKey != before && p.Status.Phase == v1alpha1.PhaseConnected
		})
		federation.AllPairsTalk(t, cs)
		if !strings.Contains(a.Agent.Log(), "WireGuard key rotated") {
			t.Error("a never logged a rotation")
		}
	})

	t.Run("new pod range", func(t *testing.T) {
		oldView := federation.ViewOf(t, b, a, a.Pod.Addr)
		// a's pod network becomes 10.1.0.0/16.
		a.Site.PodCIDR = netip.MustParsePrefix("10.1.0.0/16")
		a.Pod = a.Site.AddPod("q", netip.MustParseAddr("10.1.0.5"))
		a.Pod.ServeTCP(federation.PodPort)
		restart(func(args []string) []string {
			i := indexOf(args, "--pod-cidr")
			args[i+1] = "10.1.0.0/16"
			return args
		})
		waitForA("new range", func(p v1alpha1.Peer) bool {
			return len(p.Status.TheirNetworks) == 1 && p.Status.TheirNetworks[0].Range == "10.1.0.0/16" && p.Status.Phase == v1alpha1.PhaseConnected
		})
		federation.AllPairsTalk(t, cs)
		// b's old view of a's old range went to quarantine, and is no
		// longer among its views.
		ledger := b.Site.MustExec(b.Bin, "ledger", "show", "--state-dir", b.StateDir)
		oldBlock := netip.PrefixFrom(oldView, 16).Masked().String()
		_, rest, _ := strings.Cut(ledger, "MY VIEWS OF PEERS")
		myViews, rest, _ := strings.Cut(rest, "THEIR VIEWS OF ME")
		_, quarantine, found := strings.Cut(rest, "QUARANTINE")
		row := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(oldBlock) + `\s+` + peerOfA().Name + `\s+10\.0\.0\.0/16\s`)
		if !found || !row.MatchString(quarantine) || strings.Contains(myViews, oldBlock) {
			t.Errorf("b's old view %s of a's old range is not (only) in quarantine:\n%s", oldBlock, ledger)
		}
	})
}
