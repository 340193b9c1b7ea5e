package tunnel_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// Adding a peer leaves the NAT rules of the others as they were; removing
// a peer removes its route, WireGuard peer, NAT chains and map elements
// and leaves every other object as it was; removing all peers leaves none
// of ours; cleanup removes the link and table too. A foreign route and a
// foreign nftables table survive all of it.
func TestAddRemovePeer(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16", "10.0.0.0/16")
	a, b, c := m.sites[0], m.sites[1], m.sites[2]
	a.exec(t, "ip", "route", "add", "10.200.0.0/16", "dev", "lan0", "proto", "static")
	a.exec(t, "nft", "add table ip foreign; add chain ip foreign post { type nat hook postrouting priority 50; }; add rule ip foreign post ip daddr 10.70.0.0/16 counter")
	for _, s := range m.sites {
		m.start(s)
	}
	m.apply(b, m.desiredFor(b, a, c))
	m.apply(c, m.desiredFor(c, a, b))
	m.apply(a, m.desiredFor(a, b))
	onlyB := a.ownedRules(t)
	if len(onlyB) != 2 {
		t.Fatalf("with peer b: want its 2 NAT rules, got %v", onlyB)
	}
	m.apply(a, m.desiredFor(a, b, c))
	beforeRules := a.ownedRules(t)
	beforeRoutes := a.ownedRoutes(t)
	if len(beforeRules) != 4 || len(beforeRoutes) != 2 {
		t.Fatalf("before: want 4 rules and 2 routes, got %v and %v", beforeRules, beforeRoutes)
	}
	for comment, handle := range onlyB {
		if got := beforeRules[comment]; got != handle {
			t.Errorf("rule of peer b touched when c was added: %s: handle %q, was %q", comment, got, handle)
		}
	}
	if err := a.pod.Ping(a.seenFrom(c)); err != nil {
		t.Errorf("a -> c after adding c: %v", err)
	}

	m.apply(a, m.desiredFor(a, c))
	if got, want := a.wgPeers(t), []string{c.pub.String()}; !slices.Equal(got, want) {
		t.Errorf("wireguard peers after removing b: %v, want %v", got, want)
	}
	routes := a.ownedRoutes(t)
	if len(routes) != 1 || !strings.HasPrefix(routes[0], a.views["c"].String()+" ") {
		t.Errorf("routes after removing b: %q, want only the one to %s", routes, a.views["c"])
	}
	rules := a.ownedRules(t)
	for comment, handle := range beforeRules {
		isB := strings.Contains(comment, "peer=cluster-b ")
		got, present := rules[comment]
		switch {
		case isB && present:
			t.Errorf("rule of removed peer b still there: %s", comment)
		case !isB && got != handle:
			t.Errorf("rule of peer c touched: %s: handle %q, was %q", comment, got, handle)
		}
	}
	if len(rules) != 2 {
		t.Errorf("rules after removing b: %v, want the 2 of peer c", rules)
	}
	if l := a.natListing(t); strings.Contains(l, "cluster-b") {
		t.Errorf("chains or map elements of removed peer b left:\n%s", l)
	}
	if err := a.pod.Ping(a.seenFrom(c)); err != nil {
		t.Errorf("a -> c after removing b: %v", err)
	}

	m.apply(a, m.desiredFor(a))
	if p := a.wgPeers(t); len(p) != 0 {
		t.Errorf("wireguard peers with no peer desired: %v", p)
	}
	if r := a.ownedRoutes(t); len(r) != 0 {
		t.Errorf("routes with no peer desired: %v", r)
	}
	if r := a.ownedRules(t); len(r) != 0 {
		t.Errorf("NAT rules with no peer desired: %v", r)
	}
	if l := a.natListing(t); strings.Contains(l, "jump egress-") || strings.Contains(l, "jump ingress-") || strings.Contains(l, "cluster-") {
		t.Errorf("NAT chains or map elements with no peer desired:\n%s", l)
	}

	// Stop with cleanup: nothing of ours is left, the foreign objects are.
	a.proc.Stop()
	m.start(a, "-cleanup")
	m.apply(a, m.desiredFor(a, b, c))
	if err := a.proc.Stop(); err != nil {
		t.Fatalf("tunnel process with -cleanup: %v\n%s", err, a.proc.Tail(20))
	}
	assertNothingOurs(t, a)
	if out := a.exec(t, "ip", "route", "show", "10.200.0.0/16"); !strings.Contains(out, "lan0") {
		t.Errorf("foreign route removed: %q", out)
	}
	if out := a.exec(t, "nft", "list", "table", "ip", "foreign"); !strings.Contains(out, "10.70.0.0/16") {
		t.Errorf("foreign nftables table changed: %q", out)
	}
}

func assertNothingOurs(t *testing.T, s *meshSite) {
	t.Helper()
	if out, err := s.Exec(context.Background(), "ip", "link", "show", s.ifname); err == nil {
		t.Errorf("link %s left behind: %s", s.ifname, out)
	}
	if r := s.ownedRoutes(t); len(r) != 0 {
		t.Errorf("routes left behind: %v", r)
	}
	if out := s.exec(t, "nft", "list", "tables"); strings.Contains(out, "flotilla") {
		t.Errorf("nftables table left behind: %s", out)
	}
	if _, err := os.Stat("/var/run/wireguard/" + s.ifname + ".sock"); err == nil {
		t.Errorf("control socket of %s left behind", s.ifname)
	}
}

// Someone deletes one of our routes, flushes or deletes our nftables
// table, deletes or changes a chain or map of it, or deletes the link: the
// tunnel puts it back as it was and traffic flows.
func TestRepair(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	m.applyFullMesh()
	if err := a.pod.Ping(a.seenFrom(b)); err != nil {
		t.Fatalf("before: %v", err)
	}
	wantRoutes, wantNAT := a.ownedRoutes(t), a.natListing(t)
	if !strings.Contains(wantNAT, "jump egress-cluster-b") || !strings.Contains(wantNAT, "snat prefix to") || !strings.Contains(wantNAT, "maxseg size set rt mtu") {
		t.Fatalf("NAT before: no dispatch to peer b, no snat or no mss clamp:\n%s", wantNAT)
	}
	sameNAT := func() bool { return a.natListing(t) == wantNAT }
	for _, tc := range []struct {
		name   string
		break_ []string
		back   func() bool
	}{
		{"route deleted", []string{"ip", "route", "del", a.views["b"].String()}, func() bool { return slices.Equal(a.ownedRoutes(t), wantRoutes) }},
		{"table flushed", []string{"nft", "flush", "table", "ip", "flotilla"}, sameNAT},
		{"table deleted", []string{"nft", "delete", "table", "ip", "flotilla"}, sameNAT},
		{"base chain deleted", []string{"nft", "delete", "chain", "ip", "flotilla", "ingress"}, sameNAT},
		{"peer chain flushed", []string{"nft", "flush", "chain", "ip", "flotilla", "egress-cluster-b"}, sameNAT},
		{"forward chain deleted", []string{"nft", "delete", "chain", "ip", "flotilla", "forward"}, sameNAT},
		{"forward chain flushed", []string{"nft", "flush", "chain", "ip", "flotilla", "forward"}, sameNAT},
		{"map element deleted", []string{"nft", "delete", "element", "ip", "flotilla", "egress-peers", "{", a.views["b"].String(), "}"}, sameNAT},
		{"foreign rule in our chain", []string{"nft", "add", "rule", "ip", "flotilla", "egress", "counter"}, sameNAT},
		{"foreign chain and map in our table", []string{"nft", "add chain ip flotilla junk; add map ip flotilla junkmap { type ipv4_addr : verdict; elements = { 10.9.9.9 : jump junk } }"}, sameNAT},
		{"link set down", []string{"ip", "link", "set", a.ifname, "down"}, func() bool {
			// Down, the link lost its routes: it comes back up with them.
			return slices.Equal(a.ownedRoutes(t), wantRoutes) && strings.Contains(a.exec(t, "ip", "link", "show", a.ifname), ",UP")
		}},
		{"link deleted", []string{"ip", "link", "del", a.ifname}, func() bool {
			return slices.Equal(a.ownedRoutes(t), wantRoutes) && sameNAT() && len(a.wgPeers(t)) == 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.exec(t, tc.break_[0], tc.break_[1:]...)
			took := waitUntil(t, 5*time.Second, "repaired", tc.back)
			t.Logf("%s: repaired after %s", tc.name, took.Round(time.Millisecond))
			if err := a.pod.Ping(a.seenFrom(b)); err != nil {
				t.Errorf("after repair: %v", err)
			}
		})
	}
}

// Across a restart of the tunnel process the data path stays: while the
// process is down the link, our routes and our NAT table are in place, and
// a continuous ping (every 10 ms) that ran before the restart gets answers
// again after it, with no action but the new process applying the same
// desired state. How much traffic a restart costs is a measurement, not a
// pass criterion: BenchmarkRestart reports it.
func TestRestartKeepsDataPath(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	m.applyFullMesh()
	r := restart(t, m, a, b)
	t.Logf("tunnel process down and back in %s; ping across restart: %s", r.downAndBack.Round(time.Millisecond), r.ping)
}

// restartResult is what one restart of a site's tunnel process cost.
type restartResult struct {
	downAndBack time.Duration // SIGTERM to the new process having applied
	lost        time.Duration // traffic lost by a ping every 10 ms
	ping        string        // ping's summary
}

var (
	pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received.*time (\d+)ms`)
	pingSeq     = regexp.MustCompile(`icmp_seq=(\d+) `)
)

// restart stops the tunnel process of s while a pod of s pings the pod of
// o every 10 ms, checks that link, routes and NAT stay while it is down,
// starts it again with the same desired state and waits for the ping to
// be answered again.
func restart(t testing.TB, m *mesh, s, o *meshSite) restartResult {
	t.Helper()
	dst := s.seenFrom(o)
	if err := s.pod.Ping(dst); err != nil {
		t.Fatalf("before restart: %v", err)
	}
	// A process log is appended to under its name: a new name per
	// restart, so that this restart's figures are read, not the first's.
	s.restarts++
	ping := s.pod.Start(fmt.Sprintf("ping-across-restart-%d", s.restarts), "ping", "-n", "-i", "0.01", "-W", "1", dst.String())
	lastSeq := func() int {
		seq := -1
		for _, m := range pingSeq.FindAllStringSubmatch(ping.Log(), -1) {
			seq, _ = strconv.Atoi(m[1])
		}
		return seq
	}
	waitUntil(t, 10*time.Second, "ping answered before the restart", func() bool { return lastSeq() >= 20 })

	stopped := time.Now()
	if err := s.proc.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if out, err := s.Exec(context.Background(), "ip", "route", "show", "proto", fmt.Sprint(tunnel.DefaultRouteProtocol)); err != nil || !strings.Contains(string(out), s.ifname) {
		t.Errorf("routes gone while the tunnel process is down: %q %v", out, err)
	}
	if l := s.natListing(t); !strings.Contains(l, "snat prefix to") || !strings.Contains(l, "dnat prefix to") {
		t.Errorf("NAT gone while the tunnel process is down:\n%s", l)
	}
	m.start(s)
	m.apply(s, m.desiredFor(s, o))
	downAndBack := time.Since(stopped)
	resumedAfter := lastSeq()
	// A WireGuard handshake that gets no answer is retried after 5 s;
	// three tries is the functional bound for traffic to flow again.
	waitUntil(t, 16*time.Second, "ping answered again after the restart", func() bool { return lastSeq() > resumedAfter+10 })

	ping.Signal(syscall.SIGINT)
	<-ping.Done()
	sm := pingSummary.FindStringSubmatch(ping.Log())
	if sm == nil {
		t.Fatalf("ping output: %s", ping.Tail(5))
	}
	sent, _ := strconv.Atoi(sm[1])
	got, _ := strconv.Atoi(sm[2])
	ms, _ := strconv.Atoi(sm[3])
	// ping sends slower than every 10 ms on a loaded machine: spread the
	// time it ran over what it sent.
	lost := time.Duration(sent-got) * time.Duration(ms) * time.Millisecond / time.Duration(max(sent, 1))
	return restartResult{downAndBack: downAndBack, lost: lost, ping: sm[0]}
}

// A WireGuard peer set up by hand with wg(8) and ip(8) on a stock
// wireguard-go device is a peer of ours. Its cluster uses 10.9.0.0/16,
// which our cluster (10.0.0.0/16) sees as is; it sees ours as 10.70.0.0/16
// so it needs no NAT of its own.
func TestStockWireGuardPeer(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.9.0.0/16")
	a, b := m.sites[0], m.sites[1]
	a.views["b"] = b.PodCIDR
	b.views["a"] = mustPrefix("10.70.0.0/16")
	m.start(a)
	m.apply(a, m.desiredFor(a, b))
	b.proc = b.Start("wireguard-go-b", os.Args[0], bareArg, b.ifname)
	waitUntil(t, 5*time.Second, "stock device up", func() bool {
		_, err := os.Stat("/var/run/wireguard/" + b.ifname + ".sock")
		return err == nil
	})
	keyFile := b.keyFile
	b.exec(t, "sh", "-c", fmt.Sprintf("wg set %s private-key %s listen-port %d peer %s endpoint %s:%d allowed-ips %s",
		b.ifname, keyFile, b.port, a.pub, a.Addr, a.port, b.views["a"]))
	b.exec(t, "ip", "link", "set", b.ifname, "up")
	b.waitListening(t)
	b.exec(t, "ip", "route", "add", b.views["a"].String(), "dev", b.ifname)
	b.pod.ServeTCP(8080)
	a.pod.ServeTCP(8080)
	if err := a.pod.Ping(a.seenFrom(b)); err != nil {
		t.Fatalf("ours -> stock: %v", err)
	}
	if seen, err := a.pod.TCPExchange(netipAddrPort(a.seenFrom(b), 8080)); err != nil || seen != b.seenFrom(a) {
		t.Errorf("ours -> stock over TCP: seen as %s (%v), want %s", seen, err, b.seenFrom(a))
	}
	if seen, err := b.pod.TCPExchange(netipAddrPort(b.seenFrom(a), 8080)); err != nil || seen != a.seenFrom(b) {
		t.Errorf("stock -> ours over TCP: seen as %s (%v), want %s", seen, err, a.seenFrom(b))
	}
}

// A suspended tunnel has no link, routes or tables of ours, and puts none
// back, for a repair or for a new desired state, until it resumes; then
// the data path is back as last applied and traffic flows.
func TestSuspendResume(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	for _, s := range m.sites {
		m.start(s)
	}
	m.apply(b, m.desiredFor(b, a))
	m.apply(a, m.desiredFor(a, b))
	if err := a.pod.Ping(a.seenFrom(b)); err != nil {
		t.Fatalf("a -> b before the suspension: %v", err)
	}
	if len(a.ownedRoutes(t)) == 0 || len(a.ownedRules(t)) == 0 {
		t.Fatalf("before the suspension: routes %v, rules %v; want some of each", a.ownedRoutes(t), a.ownedRules(t))
	}
	logged := func(line string, n int) {
		t.Helper()
		waitUntil(t, 10*time.Second, fmt.Sprintf("site a's tunnel logs %q %d times", line, n), func() bool {
			return strings.Count(a.proc.Log(), "msg="+line) >= n
		})
	}
	if err := a.proc.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	logged("suspended", 1)
	// The witness that it got past where it would have put things back:
	// a new desired state, applied, and a full repair's period.
	m.apply(a, m.desiredFor(a, b))
	time.Sleep(2 * time.Second)
	if out, err := a.Exec(context.Background(), "ip", "link", "show", a.ifname); err == nil {
		t.Errorf("link of a suspended tunnel:\n%s", out)
	}
	if r := a.ownedRoutes(t); len(r) > 0 {
		t.Errorf("routes of a suspended tunnel: %v", r)
	}
	if l := a.natListing(t); l != "" {
		t.Errorf("NAT table of a suspended tunnel:\n%s", l)
	}
	if err := a.pod.Ping(a.seenFrom(b)); err == nil {
		t.Error("a -> b answered through a suspended tunnel")
	}
	if strings.Contains(a.proc.Log(), "err=") && !strings.Contains(a.proc.Log(), "err=<nil>") {
		t.Errorf("the suspension failed:\n%s", a.proc.Tail(20))
	}

	if err := a.proc.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	logged("resumed", 1)
	if strings.Contains(a.proc.Log(), `msg=resumed err="`) {
		t.Fatalf("the resumption failed:\n%s", a.proc.Tail(20))
	}
	a.waitListening(t)
	waitUntil(t, 30*time.Second, "a -> b after the resumption", func() bool { return a.pod.Ping(a.seenFrom(b)) == nil })
	if len(a.ownedRoutes(t)) == 0 || len(a.ownedRules(t)) == 0 {
		t.Fatalf("after the resumption: routes %v, rules %v; want some of each", a.ownedRoutes(t), a.ownedRules(t))
	}
}
