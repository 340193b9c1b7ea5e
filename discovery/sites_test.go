package discovery

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/test/harness"
)

// These tests run discovery in real processes inside harness sites: the
// test binary re-executes itself as a member (memberProcess) in each
// site's network namespace, so mDNS crosses a real bridge.

const helperEnv = "FLOTILLA_DISCOVERY_MEMBER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(memberProcess())
	}
	if os.Getenv(groupEnv) != "" {
		os.Exit(groupProcess())
	}
	os.Exit(m.Run())
}

// memberProcess runs one member until SIGTERM. Configuration comes from
// the environment; it prints "event <kind> <cluster ID> <sources>" for
// every member event and "first-mdns-candidate <ms>" once.
func memberProcess() int {
	env := func(k string) string { return os.Getenv("FLOTILLA_" + k) }
	seed, _ := base64.StdEncoding.DecodeString(env("IDENTITY_SEED"))
	id, err := identity.FromSeed(seed)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	key, _ := base64.StdEncoding.DecodeString(env("KEY"))
	start := time.Now()
	if os.Getenv("FLOTILLA_DEBUG_STACKS") != "" {
		go func() {
			time.Sleep(5 * time.Second)
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			os.Stderr.Write(buf[:n])
		}()
	}
	fmt.Println("starting")
	cfg := Config{
		Protocol:       testProtocol,
		Identity:       id,
		Keys:           [][]byte{key},
		BindAddr:       netip.MustParseAddrPort(env("BIND")),
		MDNS:           env("MDNS") == "1",
		BrowseInterval: time.Second,
		RetryMin:       200 * time.Millisecond,
		RetryMax:       2 * time.Second,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if s := env("SEEDS"); s != "" {
		cfg.Seeds = strings.Split(s, ",")
	}
	d, err := New(cfg)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Start(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("started", id.ClusterID())
	go func() {
		for ctx.Err() == nil {
			for _, c := range d.cands.list() {
				if c.Sources[0] == SourceMDNS {
					fmt.Printf("first-mdns-candidate %d\n", time.Since(start).Milliseconds())
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	for ev := range d.Subscribe(ctx) {
		var sources []string
		for _, s := range ev.Member.Sources {
			sources = append(sources, string(s))
		}
		fmt.Println("event", ev.Kind, ev.Member.ClusterID, strings.Join(sources, ","))
	}
	_ = d.Close()
	return 0
}

type member struct {
	id   identity.Identity
	site *harness.Site
	proc *harness.Process
	env  []string
}

func startMember(t testing.TB, s *harness.Site, id identity.Identity, key []byte, mdns bool, seeds ...string) *member {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := &member{id: id, site: s}
	mdnsFlag := "0"
	if mdns {
		mdnsFlag = "1"
	}
	m.env = []string{
		helperEnv + "=1",
		"FLOTILLA_DEBUG_STACKS=" + os.Getenv("FLOTILLA_DEBUG_STACKS"),
		"FLOTILLA_IDENTITY_SEED=" + base64.StdEncoding.EncodeToString(id.Seed()),
		"FLOTILLA_KEY=" + base64.StdEncoding.EncodeToString(key),
		"FLOTILLA_BIND=" + netip.AddrPortFrom(s.Addr, DefaultGossipPort).String(),
		"FLOTILLA_MDNS=" + mdnsFlag,
		"FLOTILLA_SEEDS=" + strings.Join(seeds, ","),
	}
	m.start(t, bin)
	return m
}

func (m *member) start(t testing.TB, bin string) {
	argv := append([]string{"env"}, m.env...)
	argv = append(argv, bin, "-test.run=^$")
	m.proc = m.site.Start("member-"+m.id.ClusterID()[:8], argv...)
	if dir := os.Getenv("FLOTILLA_DEBUG_STACKS"); dir != "" {
		p := m.proc
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(dir, m.site.SiteName+"-"+strconv.Itoa(p.Pid())+".log"), []byte(p.Log()), 0o644)
		})
	}
}

// lastEvent returns the kind and sources of the last event about id in
// m's output.
func (m *member) lastEvent(id string) (kind, sources string) {
	for _, line := range strings.Split(m.proc.Log(), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "event" && f[2] == id {
			kind, sources = f[1], f[3]
		}
	}
	return kind, sources
}

// waitEvent waits until the last event of id is kind; "alive" stands for
// join or update. With sources, the event must carry them too.
func waitEvent(t *testing.T, m *member, id, kind string, within time.Duration, sources ...string) {
	t.Helper()
	want := strings.Join(sources, ",")
	waitUntil(t, within, func() error {
		got, src := m.lastEvent(id)
		ok := got == kind || kind == "alive" && (got == "join" || got == "update")
		if !ok || want != "" && src != want {
			return fmt.Errorf("%s: last event of %s is %q from %q, want %q from %q; output:\n%s",
				m.site.SiteName, id, got, src, kind, want, m.proc.Tail(15))
		}
		return nil
	})
}

func newIdentities(t testing.TB, n int) []identity.Identity {
	ids := make([]identity.Identity, n)
	for i := range ids {
		ids[i] = mustIdentity(t)
	}
	return ids
}

func TestSitesFindEachOtherByMDNS(t *testing.T) {
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	ids := newIdentities(t, 3)
	var ms []*member
	for i, name := range []string{"a", "b", "c"} {
		s := env.NewSite(name, harness.SiteOptions{LAN: lan})
		ms = append(ms, startMember(t, s, ids[i], testKey, true))
	}
	for _, m := range ms {
		for _, o := range ms {
			if o != m {
				waitEvent(t, m, o.id.ClusterID(), "alive", 30*time.Second, string(SourceMDNS))
			}
		}
		waitUntil(t, 10*time.Second, func() error {
			if !strings.Contains(m.proc.Log(), "first-mdns-candidate") {
				return fmt.Errorf("%s found no mDNS candidate", m.site.SiteName)
			}
			return nil
		})
	}

	// SIGKILL one: the others report it failed; restarted with the same
	// identity it rejoins as the same member.
	victim := ms[2]
	victim.proc.Kill()
	for _, m := range ms[:2] {
		waitEvent(t, m, victim.id.ClusterID(), "failed", 30*time.Second)
	}
	bin, _ := os.Executable()
	victim.start(t, bin)
	for _, m := range ms[:2] {
		waitEvent(t, m, victim.id.ClusterID(), "alive", 30*time.Second)
	}
}

func TestOtherFederationOnTheLANLearnsNothing(t *testing.T) {
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	ids := newIdentities(t, 3)
	a := startMember(t, env.NewSite("a", harness.SiteOptions{LAN: lan}), ids[0], testKey, true)
	b := startMember(t, env.NewSite("b", harness.SiteOptions{LAN: lan}), ids[1], testKey, true)
	otherKey := []byte(strings.Repeat("x", 32))
	seedA := netip.AddrPortFrom(a.site.Addr, DefaultGossipPort).String()
	x := startMember(t, env.NewSite("x", harness.SiteOptions{LAN: lan}), ids[2], otherKey, true, seedA)
	waitEvent(t, a, b.id.ClusterID(), "alive", 30*time.Second)
	waitEvent(t, b, a.id.ClusterID(), "alive", 30*time.Second)
	// Witness that the outsider got past where it would have joined: it saw
	// the federation's adverts and ignored them, and its seed join failed
	// more than once (the log is at debug level).
	waitUntil(t, 30*time.Second, func() error {
		log := x.proc.Log()
		if !strings.Contains(log, "other_federation") {
			return errors.New("outsider has not yet seen the federation's adverts")
		}
		if n := strings.Count(log, "join candidate failed"); n < 2 {
			return fmt.Errorf("outsider's joins failed %d times, want 2", n)
		}
		return nil
	})
	if strings.Contains(x.proc.Log(), "event ") {
		t.Errorf("outsider learned of members:\n%s", x.proc.Tail(20))
	}
	for _, m := range []*member{a, b} {
		if kind, _ := m.lastEvent(x.id.ClusterID()); kind != "" {
			t.Errorf("%s reported the outsider", m.site.SiteName)
		}
	}
}

func TestRoutedSitesFindEachOtherBySeedsWithoutMulticast(t *testing.T) {
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	rtr := env.NewRouter("wan")
	ids := newIdentities(t, 2)
	sa := env.NewSite("a", harness.SiteOptions{Router: rtr})
	sb := env.NewSite("b", harness.SiteOptions{Router: rtr})
	a := startMember(t, sa, ids[0], testKey, true)
	b := startMember(t, sb, ids[1], testKey, true, netip.AddrPortFrom(sa.Addr, DefaultGossipPort).String())
	// b found a by its seed; a heard of b only from b itself.
	waitEvent(t, a, b.id.ClusterID(), "alive", 30*time.Second, string(SourceGossip))
	waitEvent(t, b, a.id.ClusterID(), "alive", 30*time.Second, string(SourceSeed))
	if strings.Contains(a.proc.Log()+b.proc.Log(), "first-mdns-candidate") {
		t.Error("an mDNS candidate crossed a router")
	}
}
