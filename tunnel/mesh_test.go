package tunnel_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// meshSite is one cluster's gateway in a test mesh, with its tunnel
// process and one pod.
type meshSite struct {
	*harness.Site
	name    string
	ifname  string
	port    uint16
	keyFile string
	desired string
	pub     tunnel.Key
	pod     *harness.Pod
	proc    *harness.Process
	// views maps a peer's name to how this site addresses that peer's
	// PodCIDR.
	views map[string]netip.Prefix
	// restarts counts restart() calls on the site.
	restarts int
}

type mesh struct {
	t     testing.TB
	env   *harness.Env
	lan   *harness.LAN // the gateways' LAN
	sites []*meshSite
}

// newMesh creates one site per PodCIDR on a LAN, site i with a pod at host
// .(i+1).(i+5) of its PodCIDR, and gives every site a view of every other:
// the real range where it collides with nothing the site already uses,
// otherwise the next free 10.(70+10i+n).0.0/16, so that no two sites see
// each other under the same range. Tunnels are not started.
func newMesh(t testing.TB, cidrs ...string) *mesh {
	t.Helper()
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2, harness.Ping, harness.NFT, harness.WG)
	lan := env.NewLAN("lan")
	m := &mesh{t: t, env: env, lan: lan}
	for i, c := range cidrs {
		name := string(rune('a' + i))
		cidr := netip.MustParsePrefix(c)
		s := env.NewSite(name, harness.SiteOptions{LAN: lan, PodCIDR: cidr})
		dir := filepath.Join(env.Dir, "site-"+name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		ms := &meshSite{
			Site:    s,
			name:    name,
			ifname:  env.LinkName("o" + name),
			port:    51820,
			keyFile: filepath.Join(dir, "key"),
			desired: filepath.Join(dir, "desired.json"),
			views:   map[string]netip.Prefix{},
		}
		// A process killed at cleanup leaves its control socket behind.
		t.Cleanup(func() { os.Remove("/var/run/wireguard/" + ms.ifname + ".sock") })
		key, err := tunnel.LoadOrCreateKeyFile(ms.keyFile)
		if err != nil {
			t.Fatal(err)
		}
		ms.pub = key.PublicKey()
		ms.pod = s.AddPod("p1", hostIn(cidr, byte(i+1), byte(i+5)))
		m.sites = append(m.sites, ms)
	}
	for i, s := range m.sites {
		used := []netip.Prefix{s.PodCIDR}
		next := 70 + 10*i
		for _, o := range m.sites {
			if o == s {
				continue
			}
			v := o.PodCIDR
			for overlapsAny(v, used) {
				v = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(next), 0, 0}), o.PodCIDR.Bits())
				next++
			}
			used = append(used, v)
			s.views[o.name] = v
		}
	}
	return m
}

func overlapsAny(p netip.Prefix, ps []netip.Prefix) bool {
	for _, q := range ps {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

func hostIn(p netip.Prefix, b2, b3 byte) netip.Addr {
	a := p.Addr().As4()
	a[2], a[3] = b2, b3
	return netip.AddrFrom4(a)
}

// translate maps addr from the prefix it is in to the same host in to.
func translate(addr netip.Addr, from, to netip.Prefix) netip.Addr {
	a, f, t := addr.As4(), from.Addr().As4(), to.Addr().As4()
	var out [4]byte
	for i := range out {
		out[i] = t[i] | (a[i] &^ f[i])
	}
	return netip.AddrFrom4(out)
}

// seenFrom is the address site s uses for the pod of site o.
func (s *meshSite) seenFrom(o *meshSite) netip.Addr {
	return translate(o.pod.Addr, o.PodCIDR, s.views[o.name])
}

// desiredFor builds site s's desired state with the given peers.
func (m *mesh) desiredFor(s *meshSite, peers ...*meshSite) tunnel.Desired {
	d := tunnel.Desired{Networks: []netip.Prefix{s.PodCIDR}}
	for _, o := range peers {
		d.Peers = append(d.Peers, tunnel.Peer{
			ClusterID: "cluster-" + o.name,
			PublicKey: o.pub,
			Endpoint:  netip.AddrPortFrom(o.Addr, o.port),
			Views:     []tunnel.View{{Real: o.PodCIDR, As: s.views[o.name]}},
			ViewsOfMe: []tunnel.View{{Real: s.PodCIDR, As: o.views[s.name]}},
		})
	}
	return d
}

// start runs the site's tunnel process in its namespace.
func (m *mesh) start(s *meshSite, extra ...string) {
	m.t.Helper()
	args := append([]string{os.Args[0], helperArg, "-interface", s.ifname, "-mode", "userspace",
		"-port", fmt.Sprint(s.port), "-key", s.keyFile, "-desired", s.desired}, extra...)
	os.Remove(s.desired + ".applied")
	s.proc = s.Start("tunnel-"+s.name, args...)
}

// apply writes the desired state for s and waits until its tunnel
// process reports it applied.
func (m *mesh) apply(s *meshSite, d tunnel.Desired) {
	m.t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		m.t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	want := hex.EncodeToString(sum[:])
	tmp := s.desired + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.desired); err != nil {
		m.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got, _ := os.ReadFile(s.desired + ".applied")
		if h, result, ok := strings.Cut(string(got), " "); ok && h == want {
			if result != "ok" {
				m.t.Fatalf("site %s: apply: %s", s.name, result)
			}
			return
		}
		if exited, err := s.proc.Exited(); exited {
			m.t.Fatalf("site %s: tunnel process exited (%v):\n%s", s.name, err, s.proc.Tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	m.t.Fatalf("site %s: desired state not applied after 30s:\n%s", s.name, s.proc.Tail(20))
}

// applyFullMesh starts every site's tunnel with every other site as peer.
func (m *mesh) applyFullMesh() {
	m.t.Helper()
	for _, s := range m.sites {
		m.start(s)
	}
	for _, s := range m.sites {
		m.apply(s, m.desiredFor(s, m.others(s)...))
	}
}

func (m *mesh) others(s *meshSite) []*meshSite {
	var out []*meshSite
	for _, o := range m.sites {
		if o != s {
			out = append(out, o)
		}
	}
	return out
}

// exec runs a command in the site's namespace and returns its output.
func (s *meshSite) exec(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := s.Exec(context.Background(), name, args...)
	if err != nil {
		t.Fatalf("site %s: %v", s.name, err)
	}
	return string(out)
}

// ownedRules returns the per-peer NAT rules in the site as comment ->
// handle (the comment names the peer).
func (s *meshSite) ownedRules(t testing.TB) map[string]string {
	t.Helper()
	out, err := s.Exec(context.Background(), "nft", "-a", "list", "table", "ip", "flotilla")
	if err != nil {
		return nil
	}
	rules := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		_, rest, ok := strings.Cut(line, `comment "flotilla peer=`)
		if !ok {
			continue
		}
		comment, tail, _ := strings.Cut(rest, `"`)
		_, handle, _ := strings.Cut(tail, "# handle ")
		rules["flotilla peer="+comment] = strings.TrimSpace(handle)
	}
	return rules
}

// natListing returns our table as nft lists it, one statement a line,
// sorted, so that two listings of the same content compare equal whatever
// order objects were made in. Empty if the table does not exist.
func (s *meshSite) natListing(t testing.TB) string {
	t.Helper()
	out, err := s.Exec(context.Background(), "nft", "list", "table", "ip", "flotilla")
	if err != nil {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		for _, part := range strings.Split(strings.Trim(strings.TrimSpace(l), "{},"), ",") {
			if part = strings.TrimSpace(part); part != "" && part != "}" {
				lines = append(lines, part)
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// ownedRoutes returns our routes in the site (protocol 0x66), one line each.
func (s *meshSite) ownedRoutes(t testing.TB) []string {
	t.Helper()
	out := strings.TrimSpace(s.exec(t, "ip", "-4", "route", "show", "proto", fmt.Sprint(tunnel.DefaultRouteProtocol)))
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// wgPeers returns the public keys of the peers on the site's interface.
func (s *meshSite) wgPeers(t testing.TB) []string {
	t.Helper()
	out := strings.TrimSpace(s.exec(t, "wg", "show", s.ifname, "peers"))
	if out == "" {
		return nil
	}
	return strings.Fields(out)
}

// waitListening waits until the site's WireGuard device has bound its UDP
// port. wireguard-go opens it only once it has processed the link's up
// event, asynchronously to `ip link set up`; a handshake sent before is
// lost and retried only 5 s later, longer than a test's ping waits.
func (s *meshSite) waitListening(t testing.TB) {
	t.Helper()
	s.waitListeningOn(t, s.port)
}

func (s *meshSite) waitListeningOn(t testing.TB, port uint16) {
	t.Helper()
	waitUntil(t, 5*time.Second, fmt.Sprintf("site %s: wireguard listening on udp port %d", s.name, port), func() bool {
		out, err := s.Exec(context.Background(), "ss", "-Hlun", fmt.Sprintf("sport = :%d", port))
		return err == nil && strings.TrimSpace(string(out)) != ""
	})
}

// waitUntil is eventually.Within for conditions that only hold or not;
// it returns how long the wait took.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return eventually.Within(t, timeout, what, func() error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	})
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func netipAddrPort(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }
