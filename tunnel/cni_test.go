package tunnel_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// iptablesNFT is the iptables of CNIs such as flannel and Calico, in its
// nftables flavour (the only one a namespace here has).
var iptablesNFT = harness.Requirement{
	Name: "iptables",
	Check: func() error {
		_, err := exec.LookPath("iptables")
		return err
	},
	Fix: "apt-get install -y --no-install-recommends iptables",
}

// cniMasquerade installs in s the masquerade a CNI installs for traffic
// leaving its PodCIDR, in one of the two shapes CNIs use.
func cniMasquerade(t *testing.T, s *meshSite, shape string) {
	t.Helper()
	podnet := s.PodCIDR.String()
	switch shape {
	case "iptables":
		s.exec(t, "iptables", "-t", "nat", "-I", "POSTROUTING", "-s", podnet, "!", "-d", "224.0.0.0/4", "-j", "MASQUERADE")
	case "nft":
		s.exec(t, "nft", fmt.Sprintf("add table ip cni; add chain ip cni post { type nat hook postrouting priority srcnat; }; "+
			"add rule ip cni post ip saddr %s ip daddr != %s masquerade", podnet, podnet))
	default:
		t.Fatalf("unknown masquerade shape %q", shape)
	}
}

// A CNI's masquerade for traffic leaving the PodCIDR, installed in the
// sending gateway before or after our table, in either shape, does not
// rewrite traffic to a view, whether the peers' PodCIDRs overlap (the
// view of the sender is remapped) or not (it is the sender's own range):
// the receiving pod sees the sender as its view of it. The masquerade
// still works for other destinations (the witness that it was in force).
func TestCNIMasqueradeDoesNotRewriteViews(t *testing.T) {
	for _, cidrs := range [][2]string{{"10.0.0.0/16", "10.0.0.0/16"}, {"10.0.0.0/16", "10.1.0.0/16"}} {
		for _, shape := range []string{"iptables", "nft"} {
			for _, order := range []string{"before", "after"} {
				t.Run(fmt.Sprintf("%s %s %s and %s", shape, order, cidrs[0], cidrs[1]), func(t *testing.T) {
					cniMasqueradeCase(t, cidrs, shape, order)
				})
			}
		}
	}
}

func cniMasqueradeCase(t *testing.T, cidrs [2]string, shape, order string) {
	harness.Require(t, iptablesNFT)
	m := newMesh(t, cidrs[0], cidrs[1])
	a, b := m.sites[0], m.sites[1]
	const port = 7070
	b.pod.ServeTCP(port)
	b.ServeTCP(port)
	if order == "before" {
		cniMasquerade(t, a, shape)
	}
	m.start(a)
	m.start(b)
	m.apply(a, m.desiredFor(a, b))
	m.apply(b, m.desiredFor(b, a))
	if order == "after" {
		cniMasquerade(t, a, shape)
	}

	want := translate(a.pod.Addr, a.PodCIDR, b.views["a"])
	var seen netip.Addr
	eventually.Within(t, 15*time.Second, "pod a's TCP exchange with pod b through the tunnel", func() error {
		var err error
		seen, err = a.pod.TCPExchange(netip.AddrPortFrom(a.seenFrom(b), port))
		return err
	})
	if seen != want {
		t.Errorf("pod b sees pod a as %s, want %s (b's view of a's %s); the CNI's masquerade rewrote it", seen, want, a.pod.Addr)
	}
	masq, err := a.pod.TCPExchange(netip.AddrPortFrom(b.Addr, port))
	if err != nil {
		t.Fatalf("the masquerade does not work for a destination outside the views: %v", err)
	}
	if masq != a.Addr {
		t.Errorf("gateway b sees pod a as %s, want the masqueraded %s: the CNI rule was not in force", masq, a.Addr)
	}
}

// A table an older agent made, its SNAT chain at the CNIs' priority
// srcnat, is replaced at the first apply by one whose SNAT chain comes
// first: a hook's priority cannot be changed in place.
func TestOldPriorityTableReplaced(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	a.exec(t, "nft", "add table ip flotilla; "+
		"add chain ip flotilla egress { type nat hook postrouting priority srcnat; policy accept; }; "+
		"add chain ip flotilla ingress { type nat hook prerouting priority dstnat; policy accept; }")
	m.start(a)
	m.start(b)
	m.apply(a, m.desiredFor(a, b))
	m.apply(b, m.desiredFor(b, a))
	out := a.exec(t, "nft", "list", "chain", "ip", "flotilla", "egress")
	if !strings.Contains(out, "priority srcnat - 10;") {
		t.Errorf("egress chain after the apply:\n%s\nwant priority srcnat - 10", out)
	}
	if err := pingEventually(a, b); err != nil {
		t.Error(err)
	}
}

// pingEventually pings s's view of o's pod from s's pod until it answers.
func pingEventually(s, o *meshSite) error {
	deadline := time.Now().Add(15 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = s.pod.Ping(s.seenFrom(o)); err == nil {
			return nil
		}
		if errors.Is(err, context.Canceled) {
			break
		}
	}
	return fmt.Errorf("%s -> %s: %w", s.name, o.name, err)
}
