package tunnel_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
	"github.com/prometheus/client_golang/prometheus"
)

// A kernel event subscription that ends on ENOBUFS (events came faster
// than the tunnel read them) is opened again, and counted: a change to
// what we own made afterwards, which only that kind of event reports, is
// repaired without waiting for a periodic resync (here an hour away). The
// overflow is real: the stream's receive buffer is made tiny and flooded
// with events that are not ours.
func TestResubscribeAfterOverflow(t *testing.T) {
	for _, tc := range []struct {
		kind   string
		flood  func(s *harness.Site, dir string) // events of the kind, none about what we own
		break_ func(ifname string) []string      // a change to what we own that only this kind reports
		back   func(s *harness.Site, ifname string) bool
	}{
		{
			kind: "route",
			flood: func(s *harness.Site, dir string) {
				var b strings.Builder
				for i := range 400 {
					fmt.Fprintf(&b, "route add 10.201.%d.%d/32 dev lan0 proto static table 100\n", i/250, i%250)
				}
				b.WriteString("route flush table 100\n")
				batch(s, dir, "ip", "-batch", b.String())
			},
			break_: func(string) []string { return []string{"ip", "route", "del", "10.70.0.0/16"} },
			back: func(s *harness.Site, ifname string) bool {
				return strings.Contains(s.MustExec("ip", "route", "show", "10.70.0.0/16"), ifname)
			},
		},
		{
			kind: "link",
			flood: func(s *harness.Site, dir string) {
				var b strings.Builder
				for i := range 300 {
					fmt.Fprintf(&b, "link set other0 alias flood-%d\n", i)
				}
				batch(s, dir, "ip", "-batch", b.String())
			},
			// Down, our link loses its routes; only a link event says so.
			break_: func(ifname string) []string { return []string{"ip", "link", "set", ifname, "down"} },
			back: func(s *harness.Site, ifname string) bool {
				return strings.Contains(s.MustExec("ip", "link", "show", ifname), ",UP") &&
					strings.Contains(s.MustExec("ip", "route", "show", "10.70.0.0/16"), ifname)
			},
		},
		{
			kind: "nftables",
			flood: func(s *harness.Site, dir string) {
				var b strings.Builder
				b.WriteString("add table ip flood\nadd chain ip flood c\n")
				for range 300 {
					b.WriteString("add rule ip flood c counter\n")
				}
				b.WriteString("delete table ip flood\n")
				batch(s, dir, "nft", "-f", b.String())
			},
			break_: func(string) []string { return []string{"nft", "flush", "table", "ip", "flotilla"} },
			back: func(s *harness.Site, _ string) bool {
				out, err := s.Exec(context.Background(), "nft", "list", "table", "ip", "flotilla")
				return err == nil && strings.Contains(string(out), "snat prefix to") && strings.Contains(string(out), "dnat prefix to")
			},
		},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			logs := &records{}
			reg := prometheus.NewRegistry()
			site, tun, cfg := siteTunnel(t, tunnel.Config{Logger: slog.New(logs), Metrics: reg})
			addOtherLink(site)
			// The smallest buffer the kernel allows: a few messages.
			tunnel.SetEventBuffer(tun, tc.kind, 1)
			tunnel.SetResyncInterval(tun, time.Hour)
			if err := site.Do(func() error { return tun.Apply(context.Background(), onePeer(t, mustPrefix("10.70.0.0/16"))) }); err != nil {
				t.Fatalf("apply: %v", err)
			}
			runInSite(t, site, tun, logs)

			dir := t.TempDir()
			ended := func() bool { return logs.count(slog.LevelWarn, "kernel events ended", tc.kind) > 0 }
			for i := 0; !ended(); i++ {
				if i == 20 {
					t.Fatalf("%s events: 20 floods did not overflow a minimal receive buffer", tc.kind)
				}
				tc.flood(site, dir)
			}
			brk := tc.break_(cfg.Interface)
			site.MustExec(brk[0], brk[1:]...)
			waitUntil(t, 20*time.Second, fmt.Sprintf("%v repaired after the %s events overflowed", brk, tc.kind), func() bool { return tc.back(site, cfg.Interface) })

			// The stream's end already asked for a read-back, which may
			// repair the break before the stream is opened again (after
			// its back-off): the resubscription is waited for, not
			// assumed done by then.
			waitUntil(t, 20*time.Second, fmt.Sprintf("flotilla_tunnel_resubscribes_total{kind=%q} >= 1", tc.kind), func() bool {
				return counter(t, reg, "flotilla_tunnel_resubscribes_total", "kind", tc.kind) >= 1
			})
			// However many times the flood ended the stream, the same
			// error is logged once.
			if n := logs.count(slog.LevelWarn, "kernel events ended", tc.kind); n != 1 {
				t.Errorf("stream end logged %d times, want once:\n%s", n, logs)
			}
		})
	}
}

// runInSite runs the tunnel's repair loop inside the site's namespace
// until the test ends, waits until it watches kernel events (it logs to
// logs), and at the end waits for it to return.
func runInSite(t *testing.T, site *harness.Site, tun *tunnel.Tunnel, logs *records) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- site.Do(func() error { return tun.Run(ctx) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tunnel Run: %v", err)
		}
	})
	waitUntil(t, 10*time.Second, "tunnel watching kernel events", func() bool {
		return strings.Contains(logs.String(), "watching kernel events")
	})
}

// batch runs cmd with a file holding script as its last argument.
func batch(s *harness.Site, dir string, cmd, flag, script string) {
	f := filepath.Join(dir, "batch")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		panic(err)
	}
	s.MustExec(cmd, flag, f)
}

// counter returns the value of a counter with one label, 0 if absent.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// records is a slog.Handler that keeps every record, for tests to read.
type records struct {
	mu   sync.Mutex
	recs []string // level, message, then attrs, space separated
	lvls []slog.Level
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	b.WriteString(" ")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, b.String())
	r.lvls = append(r.lvls, rec.Level)
	return nil
}

// count returns how many records of level carry msg and events=kind.
func (r *records) count(level slog.Level, msg, kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i, s := range r.recs {
		if r.lvls[i] == level && strings.HasPrefix(s, msg) && strings.Contains(s, " events="+kind+" ") {
			n++
		}
	}
	return n
}

func (r *records) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.recs, "\n")
}

// A repair that keeps failing the same way (a view another link routes)
// is logged once, not at every event; what can be repaired still is.
func TestRepairErrorLoggedOnce(t *testing.T) {
	logs := &records{}
	site, tun, _ := siteTunnel(t, tunnel.Config{Logger: slog.New(logs)})
	other := addOtherLink(site)
	site.MustExec("ip", "route", "add", "10.70.0.0/16", "dev", other, "proto", fmt.Sprint(tunnel.DefaultRouteProtocol))
	if err := site.Do(func() error { return tun.Apply(context.Background(), onePeer(t, mustPrefix("10.70.0.0/16"))) }); err == nil {
		t.Fatal("apply of a view another link routes succeeded")
	}
	runInSite(t, site, tun, logs)
	natBack := func() bool {
		out, err := site.Exec(context.Background(), "nft", "list", "table", "ip", "flotilla")
		return err == nil && strings.Contains(string(out), "snat prefix to")
	}
	for i := range 3 {
		site.MustExec("nft", "flush", "table", "ip", "flotilla")
		// The witness that a repair ran, and failed on the route again.
		waitUntil(t, 10*time.Second, fmt.Sprintf("NAT repaired after flush %d", i+1), natBack)
	}
	var failed int
	for _, r := range strings.Split(logs.String(), "\n") {
		if strings.HasPrefix(r, "repair failed") {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("the same repair error logged %d times, want once:\n%s", failed, logs)
	}
}
