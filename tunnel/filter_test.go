package tunnel_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// segregatedMesh is two sites; site a has three pods (p1 offloaded from b,
// p2 the endpoint of a Service exported to b on TCP 7081, p3 neither),
// each serving TCP on 7080 to 7082.
type segregatedMesh struct {
	*mesh
	a, b       *meshSite
	p1, p2, p3 *harness.Pod
}

func newSegregatedMesh(t *testing.T) *segregatedMesh {
	m := newMesh(t, "10.0.0.0/16", "10.1.0.0/16")
	s := &segregatedMesh{mesh: m, a: m.sites[0], b: m.sites[1]}
	s.p1 = s.a.pod
	s.p2 = s.a.AddPod("p2", hostIn(s.a.PodCIDR, 2, 2))
	s.p3 = s.a.AddPod("p3", hostIn(s.a.PodCIDR, 3, 3))
	for _, p := range []*harness.Pod{s.p1, s.p2, s.p3} {
		for port := uint16(7080); port <= 7082; port++ {
			p.ServeTCP(port)
		}
	}
	m.applyFullMesh()
	return s
}

// segregate applies site a's desired state with b Segregated to sets (nil:
// Full).
func (s *segregatedMesh) segregate(sets *policy.Sets) {
	d := s.desiredFor(s.a, s.b)
	d.Peers[0].Segregated = sets
	s.apply(s.a, d)
}

// from b's pod, to a pod of a by the address b uses for it.
func (s *segregatedMesh) dst(p *harness.Pod, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(translate(p.Addr, s.a.PodCIDR, s.b.views[s.a.name]), port)
}

// reaches waits until b's pod exchanges a line with dst: the positive
// witness that the path works before anything is expected to be dropped.
func (s *segregatedMesh) reaches(t *testing.T, dst netip.AddrPort) {
	t.Helper()
	s.reachesWithin(t, 15*time.Second, dst)
}

func (s *segregatedMesh) reachesWithin(t *testing.T, d time.Duration, dst netip.AddrPort) {
	t.Helper()
	waitUntil(t, d, "b's pod reaches "+dst.String(), func() bool {
		_, err := s.b.pod.TCPExchange(dst)
		return err == nil
	})
}

// refused asserts that a new connection from b's pod to dst does not get
// through: the SYN is dropped, so the dial times out.
func (s *segregatedMesh) refused(t *testing.T, dst netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := s.b.pod.DialContext(ctx, "tcp", dst.String())
	if err == nil {
		c.Close()
		t.Errorf("b's pod connected to %s; want it dropped", dst)
	}
}

var dropCounter = regexp.MustCompile(`counter packets (\d+) bytes (\d+) drop`)

// dropped reads the drop counter of peer b's chain as nft lists it.
func (s *segregatedMesh) dropped(t *testing.T) uint64 {
	t.Helper()
	out := s.a.exec(t, "nft", "list", "chain", "ip", tunnel.PolicyTable(tunnel.DefaultNFTable), "from-cluster-b")
	m := dropCounter.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no drop counter in chain from-cluster-b:\n%s", out)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

func (s *segregatedMesh) allowed(pods []*harness.Pod, svcs ...policy.Endpoint) *policy.Sets {
	sets := &policy.Sets{Services: svcs}
	for _, p := range pods {
		sets.Pods = append(sets.Pods, p.Addr)
	}
	return sets
}

// A Segregated peer reaches its offloaded pod on any port and the
// exported Service's endpoint on the Service's port only; everything else
// is dropped and counted.
func TestSegregatedPeerReachesOnlyWhatIsAllowed(t *testing.T) {
	s := newSegregatedMesh(t)
	s.segregate(s.allowed([]*harness.Pod{s.p1}, policy.Endpoint{Addr: s.p2.Addr, Protocol: policy.TCP, Port: 7081}))

	s.reaches(t, s.dst(s.p1, 7080))
	s.reaches(t, s.dst(s.p1, 7082))
	s.reaches(t, s.dst(s.p2, 7081))
	// An operator reads the rules and the sets plainly with nft.
	listing := s.a.exec(t, "nft", "list", "table", "ip", tunnel.PolicyTable(tunnel.DefaultNFTable))
	t.Logf("policy table:\n%s", listing)
	for _, want := range []string{
		"ip daddr @pods-cluster-b accept",
		"ip daddr . meta l4proto . th dport @services-cluster-b accept",
		fmt.Sprintf("elements = { %s . tcp . 7081 }", s.p2.Addr),
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("nft list lacks %q", want)
		}
	}
	before := s.dropped(t)
	s.refused(t, s.dst(s.p2, 7080))
	s.refused(t, s.dst(s.p3, 7081))
	if got := s.dropped(t); got <= before {
		t.Errorf("drop counter of peer b: %d before, %d after two refused connections; want it to grow", before, got)
	}
	// Replies to what a opens towards b are not b's new connections.
	s.b.pod.ServeTCP(7090)
	if _, err := s.p3.TCPExchange(netip.AddrPortFrom(s.a.seenFrom(s.b), 7090)); err != nil {
		t.Errorf("a's pod p3 to b's pod: %v; want the replies let through", err)
	}
}

// echo is an established connection from b's pod to a server that echoes
// lines back.
type echo struct {
	c net.Conn
	r *bufio.Reader
}

func serveEcho(t *testing.T, p *harness.Pod, port uint16) {
	l, err := p.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func (s *segregatedMesh) dialEcho(t *testing.T, dst netip.AddrPort) *echo {
	t.Helper()
	var e *echo
	waitUntil(t, 15*time.Second, "echo connection to "+dst.String(), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := s.b.pod.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return false
		}
		e = &echo{c: c, r: bufio.NewReader(c)}
		return true
	})
	t.Cleanup(func() { e.c.Close() })
	return e
}

func (e *echo) roundTrip(msg string) error {
	e.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(e.c, msg); err != nil {
		return err
	}
	got, err := e.r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != msg {
		return fmt.Errorf("echoed %q, want %q", got, msg)
	}
	return nil
}

// Unoffloading a pod refuses new connections to it at once, while one
// already established keeps working (conntrack).
func TestRemovedElementRefusesNewConnectionsOnly(t *testing.T) {
	s := newSegregatedMesh(t)
	serveEcho(t, s.p1, 7099)
	s.segregate(s.allowed([]*harness.Pod{s.p1, s.p2}))
	held := s.dialEcho(t, s.dst(s.p1, 7099))
	if err := held.roundTrip("before"); err != nil {
		t.Fatal(err)
	}
	s.reaches(t, s.dst(s.p1, 7080))

	s.segregate(s.allowed([]*harness.Pod{s.p2}))
	s.reaches(t, s.dst(s.p2, 7080))
	s.refused(t, s.dst(s.p1, 7080))
	if err := held.roundTrip("after"); err != nil {
		t.Errorf("established connection to the removed pod: %v; want it kept", err)
	}
}

// A live peer goes from Full to Segregated and back: what is not allowed
// passes, is dropped, passes again; Full leaves nothing of ours on the
// forward path.
func TestSwitchFullSegregated(t *testing.T) {
	s := newSegregatedMesh(t)
	table := tunnel.PolicyTable(tunnel.DefaultNFTable)
	s.reaches(t, s.dst(s.p3, 7080))
	if _, err := s.a.Exec(context.Background(), "nft", "list", "table", "ip", table); err == nil {
		t.Errorf("table %s exists with every peer Full", table)
	}

	s.segregate(s.allowed([]*harness.Pod{s.p1}))
	s.reaches(t, s.dst(s.p1, 7080))
	s.refused(t, s.dst(s.p3, 7080))

	s.segregate(nil)
	s.reaches(t, s.dst(s.p3, 7080))
	if _, err := s.a.Exec(context.Background(), "nft", "list", "table", "ip", table); err == nil {
		t.Errorf("table %s still exists after peer b went back to Full", table)
	}
}

// policyListing is the filter table as nft lists it, one statement a line,
// sorted, counters zeroed: two listings of the same content compare equal.
func (s *segregatedMesh) policyListing(t *testing.T) string {
	out, err := s.a.Exec(context.Background(), "nft", "list", "table", "ip", tunnel.PolicyTable(tunnel.DefaultNFTable))
	if err != nil {
		return ""
	}
	return sortedStatements(dropCounter.ReplaceAllString(string(out), "counter drop"))
}

func sortedStatements(listing string) string {
	var lines []string
	for _, l := range strings.Split(listing, "\n") {
		for _, part := range strings.Split(strings.Trim(strings.TrimSpace(l), "{},"), ",") {
			if part = strings.TrimSpace(part); part != "" && part != "}" {
				lines = append(lines, part)
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// Whatever someone does to the filter table, the tunnel puts it back as
// it was, and the peer is again held to what it is allowed.
func TestPolicyRepair(t *testing.T) {
	s := newSegregatedMesh(t)
	table := tunnel.PolicyTable(tunnel.DefaultNFTable)
	s.segregate(s.allowed([]*harness.Pod{s.p1}, policy.Endpoint{Addr: s.p2.Addr, Protocol: policy.TCP, Port: 7081}))
	s.reaches(t, s.dst(s.p1, 7080))
	want := s.policyListing(t)
	same := func() bool { return s.policyListing(t) == want }
	for _, tc := range []struct {
		name   string
		break_ []string
	}{
		{"table deleted", []string{"nft", "delete", "table", "ip", table}},
		{"table flushed", []string{"nft", "flush", "table", "ip", table}},
		{"peer chain flushed", []string{"nft", "flush", "chain", "ip", table, "from-cluster-b"}},
		{"base chain deleted", []string{"nft", "delete", "chain", "ip", table, "forward"}},
		{"allowed pod deleted", []string{"nft", "delete", "element", "ip", table, "pods-cluster-b", "{", s.p1.Addr.String(), "}"}},
		{"pod slipped in", []string{"nft", "add", "element", "ip", table, "pods-cluster-b", "{", s.p3.Addr.String(), "}"}},
		{"service port slipped in", []string{"nft", "add", "element", "ip", table, "services-cluster-b", "{", s.p2.Addr.String(), ".", "tcp", ".", "7080", "}"}},
		{"dispatch element deleted", []string{"nft", "delete", "element", "ip", table, "from-peers", "{", s.a.views["b"].String(), "}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.a.exec(t, tc.break_[0], tc.break_[1:]...)
			took := waitUntil(t, 10*time.Second, "repaired", same)
			t.Logf("%s: repaired after %s", tc.name, took.Round(time.Millisecond))
			s.reaches(t, s.dst(s.p1, 7080))
			s.refused(t, s.dst(s.p3, 7080))
			s.refused(t, s.dst(s.p2, 7080))
		})
	}
}

// gauge returns the value of the metric name with labels, and whether it
// is there.
func gauge(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// The metrics show each Segregated peer's set sizes and its drop counter;
// a peer back to Full has neither.
func TestPolicyMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	site, tun, _ := siteTunnel(t, tunnel.Config{Metrics: reg})
	d := onePeer(t, mustPrefix("10.80.0.0/24"))
	d.Peers[0].Segregated = &policy.Sets{
		Pods:     []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")},
		Services: []policy.Endpoint{{Addr: netip.MustParseAddr("10.0.0.7"), Protocol: policy.UDP, Port: 53}},
	}
	if err := site.Do(func() error { return tun.Apply(context.Background(), d) }); err != nil {
		t.Fatal(err)
	}
	for set, want := range map[string]float64{"pods": 2, "services": 1} {
		if got, ok := gauge(t, reg, "flotilla_tunnel_policy_set_elements", map[string]string{"peer": "b", "set": set}); !ok || got != want {
			t.Errorf("flotilla_tunnel_policy_set_elements{peer=b,set=%s} = %v (present %v), want %v", set, got, ok, want)
		}
	}
	if _, ok := gauge(t, reg, "flotilla_tunnel_policy_dropped_packets_total", map[string]string{"peer": "b", "reason": "not_allowed"}); !ok {
		t.Errorf("no flotilla_tunnel_policy_dropped_packets_total for peer b")
	}

	d.Peers[0].Segregated = nil
	if err := site.Do(func() error { return tun.Apply(context.Background(), d) }); err != nil {
		t.Fatal(err)
	}
	if _, ok := gauge(t, reg, "flotilla_tunnel_policy_set_elements", map[string]string{"peer": "b"}); ok {
		t.Errorf("peer b back to Full still has set sizes")
	}
}

// While 10,000 elements change in each of several transactions, new
// connections to an allowed pod keep being made and an established one
// keeps exchanging, and not one packet of the peer is dropped: no set is
// ever flushed and refilled.
func TestAllowedFlowsSurviveLargeChanges(t *testing.T) {
	s := newSegregatedMesh(t)
	serveEcho(t, s.p2, 7099)
	filler := func(from int) []netip.Addr {
		out := []netip.Addr{s.p1.Addr, s.p2.Addr}
		for i := range 10000 {
			out = append(out, podAddr(from+i))
		}
		return out
	}
	s.segregate(&policy.Sets{Pods: filler(0)})
	s.reaches(t, s.dst(s.p1, 7080))
	held := s.dialEcho(t, s.dst(s.p2, 7099))
	before := s.dropped(t)

	stop := make(chan struct{})
	done := make(chan [2]int)
	go func() {
		var ok, failed int
		for {
			select {
			case <-stop:
				done <- [2]int{ok, failed}
				return
			default:
			}
			if _, err := s.b.pod.TCPExchange(s.dst(s.p1, 7080)); err != nil {
				failed++
			} else {
				ok++
			}
		}
	}()
	for i := range 6 {
		s.segregate(&policy.Sets{Pods: filler(10000 * ((i + 1) % 2))})
		if err := held.roundTrip(fmt.Sprint("change ", i)); err != nil {
			t.Errorf("established connection after change %d: %v", i, err)
		}
	}
	close(stop)
	n := <-done
	if n[0] == 0 || n[1] > 0 {
		t.Errorf("new connections during the changes: %d made, %d failed; want some made and none failed", n[0], n[1])
	}
	t.Logf("%d new connections made during 6 changes of 10,000 elements", n[0])
	if after := s.dropped(t); after != before {
		t.Errorf("drop counter of peer b went from %d to %d during the changes; want no packet dropped", before, after)
	}
}

// What a Segregated peer sends to the gateway host itself (an address of
// this cluster's on the host, and whatever listens on all addresses) is
// filtered like what it sends to pods: reachable while the peer is Full,
// dropped and counted once it is Segregated.
func TestSegregatedPeerKeptFromGatewayHost(t *testing.T) {
	s := newSegregatedMesh(t)
	hostAddr := hostIn(s.a.PodCIDR, 255, 1)
	s.a.exec(t, "ip", "addr", "add", hostAddr.String()+"/32", "dev", "lo")
	s.a.ServeTCP(7085)
	toHost := netip.AddrPortFrom(translate(hostAddr, s.a.PodCIDR, s.b.views[s.a.name]), 7085)
	s.reaches(t, toHost)

	s.segregate(s.allowed([]*harness.Pod{s.p1}))
	s.reaches(t, s.dst(s.p1, 7080))
	before := s.dropped(t)
	s.refused(t, toHost)
	if got := s.dropped(t); got <= before {
		t.Errorf("drop counter of peer b: %d before, %d after a refused connection to the gateway host; want it to grow", before, got)
	}
}

// The filter survives a restart of the tunnel's process: while it is
// down, its table and sets stay in the kernel, and the new process reads
// those sets back (Tunnel.PolicySets) before anything is applied, which
// the agent holds until it has decided anew. (The test's WireGuard is
// userspace, gone with the process, so the sets are checked by listing
// while it is down, and by traffic once it is up.)
func TestPolicySetsSurviveRestart(t *testing.T) {
	s := newSegregatedMesh(t)
	sets := s.allowed([]*harness.Pod{s.p1}, policy.Endpoint{Addr: s.p2.Addr, Protocol: policy.TCP, Port: 7081})
	s.segregate(sets)
	s.reaches(t, s.dst(s.p1, 7080))
	s.refused(t, s.dst(s.p3, 7080))
	before := s.policyListing(t)

	if err := s.a.proc.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if got := s.policyListing(t); got != before {
		t.Errorf("policy table while the tunnel is down:\n%s\nwant as before:\n%s", got, before)
	}
	os.Remove(s.a.desired + ".held")
	s.start(s.a)
	var held []policy.Sets
	waitUntil(t, 15*time.Second, "the restarted tunnel reports the sets it found", func() bool {
		b, err := os.ReadFile(s.a.desired + ".held")
		return err == nil && json.Unmarshal(b, &held) == nil
	})
	want := sets.Normal()
	want.Peer = "cluster-b"
	if len(held) != 1 || !held[0].Equal(want) {
		t.Fatalf("sets read back after the restart: %+v; want %+v", held, want)
	}
	// Applied again as read, as the agent does until it has decided.
	// b's WireGuard still holds the session of a's previous process and
	// sends with it until it gives up on an answer (keepalive timeout plus
	// rekey timeout, 15 s) and handshakes again: wait past that.
	s.segregate(&held[0])
	s.reachesWithin(t, 40*time.Second, s.dst(s.p2, 7081))
	s.refused(t, s.dst(s.p3, 7080))
}

// A Segregated peer that sends with another peer's source range to pass
// as that peer (here c, which is Full) gets nothing through: WireGuard on
// this side accepts from b's key only sources within b's allowed IPs (my
// views of b), so the packets are dropped before any table of ours sees
// them. Counted on both ends: b's gateway sends them into the tunnel, none
// comes out of it here; b's own range, on the same path, does.
func TestPeerCannotPassAsAnother(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.1.0.0/16", "10.2.0.0/16")
	a, b, c := m.sites[0], m.sites[1], m.sites[2]
	p3 := a.AddPod("p3", hostIn(a.PodCIDR, 3, 3))
	m.applyFullMesh()
	d := m.desiredFor(a, b, c)
	d.Peers[0].Segregated = &policy.Sets{Pods: []netip.Addr{a.pod.Addr}}
	m.apply(a, d)

	// Counters: what leaves b's gateway into the tunnel, what comes out
	// of it at a, by source (a test table of its own, before any hook of
	// ours).
	own, forged := hostIn(b.PodCIDR, 0, 77), hostIn(c.PodCIDR, 0, 77)
	b.exec(t, "nft", "add table ip watch; add chain ip watch out { type filter hook postrouting priority -300; }; "+
		fmt.Sprintf(`add rule ip watch out oifname "%s" ip saddr %s counter comment "forged"`, b.ifname, forged))
	a.exec(t, "nft", "add table ip watch; add chain ip watch in { type filter hook prerouting priority -300; }; "+
		fmt.Sprintf(`add rule ip watch in iifname "%s" ip saddr %s counter comment "own"; `, a.ifname, a.views[b.name].Masked())+
		fmt.Sprintf(`add rule ip watch in iifname "%s" ip saddr %s counter comment "as c"`, a.ifname, a.views[c.name].Masked()))
	// b's gateway holds an address of its own range and one of c's.
	b.exec(t, "ip", "addr", "add", own.String()+"/32", "dev", "lo")
	b.exec(t, "ip", "addr", "add", forged.String()+"/32", "dev", "lo")

	allowed := translate(a.pod.Addr, a.PodCIDR, b.views[a.name])
	notAllowed := translate(p3.Addr, a.PodCIDR, b.views[a.name])
	waitUntil(t, 15*time.Second, "b's gateway reaches its allowed pod from its own range", func() bool {
		_, err := b.Exec(context.Background(), "ping", "-n", "-c", "1", "-W", "1", "-I", own.String(), allowed.String())
		return err == nil
	})
	if n := harness.NFTCounter(t, a.exec(t, "nft", "list", "table", "ip", "watch"), "own"); n == 0 {
		t.Fatalf("a counted nothing from b's own range after b's ping was answered")
	}
	const sent = 5
	if out, err := b.Exec(context.Background(), "ping", "-n", "-c", fmt.Sprint(sent), "-i", "0.2", "-W", "1", "-I", forged.String(), notAllowed.String()); err == nil {
		t.Errorf("b's gateway, as c, reached p3:\n%s", out)
	}
	if n := harness.NFTCounter(t, b.exec(t, "nft", "list", "table", "ip", "watch"), "forged"); n < sent {
		t.Errorf("b's gateway sent %d packets with c's source into the tunnel, want %d: the test did not forge", n, sent)
	}
	if n := harness.NFTCounter(t, a.exec(t, "nft", "list", "table", "ip", "watch"), "as c"); n != 0 {
		t.Errorf("%d packets from b with c's source came out of a's tunnel; want none (WireGuard's allowed IPs)", n)
	}
	// The same as c's pod itself: allowed, c being Full.
	if err := c.pod.Ping(translate(p3.Addr, a.PodCIDR, c.views[a.name])); err != nil {
		t.Errorf("c's pod to p3: %v; c is Full", err)
	}
}
