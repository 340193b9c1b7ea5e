package fabric_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/prometheus/client_golang/prometheus"
)

// runIn runs f's repair loop inside the site's namespace until the test
// ends, and waits until it watches kernel events (it logs to logs).
func runIn(t *testing.T, s *harness.Site, f *fabric.Fabric, logs *records) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Do(func() error { return f.Run(ctx) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fabric Run on %s: %v", s.SiteName, err)
		}
	})
	eventually.Within(t, 10*time.Second, "fabric watching kernel events", func() error {
		if logs.count(slog.LevelDebug, "watching kernel events", "") == 0 {
			return fmt.Errorf("not yet; logs:\n%s", logs)
		}
		return nil
	})
}

// withLogs makes a node's Fabric with a log and metrics the test reads,
// events as the only trigger of repairs, and runs it.
func (c *cluster) withLogs(t *testing.T, s *harness.Site) (*records, *prometheus.Registry) {
	t.Helper()
	logs, reg := &records{}, prometheus.NewRegistry()
	f := c.fabricWith(t, s, fabric.Config{Logger: slog.New(logs), Metrics: reg})
	fabric.SetResyncInterval(f, time.Hour)
	return logs, reg
}

// What someone removes or changes of ours is put back by Run, on kernel
// events alone (the periodic resync is an hour away); a foreign route in
// our table and foreign rules, one at our priority, are left alone.
func TestRunRepairs(t *testing.T) {
	c := newCluster(t)
	wkLogs, wkReg := c.withLogs(t, c.wk)
	gwLogs, _ := c.withLogs(t, c.gw)
	// On a link of its own: the link test below takes lan0's routes.
	c.wk.MustExec("ip", "link", "add", "other0", "type", "veth", "peer", "name", "other1")
	c.wk.MustExec("ip", "link", "set", "other0", "up")
	c.wk.MustExec("ip", "link", "set", "other1", "up")
	c.wk.MustExec("ip", "route", "add", "10.99.0.0/16", "dev", "other0", "table", fmt.Sprint(fabric.DefaultTable), "proto", "static")
	c.wk.MustExec("ip", "rule", "add", "priority", "20001", "lookup", fmt.Sprint(fabric.DefaultTable))
	c.wk.MustExec("ip", "rule", "add", "priority", fmt.Sprint(fabric.DefaultRulePriority), "lookup", "200")
	foreign := func() string {
		return c.wk.MustExec("ip", "route", "show", "table", fmt.Sprint(fabric.DefaultTable), "proto", "static") +
			c.wk.MustExec("ip", "rule", "show", "priority", "20001") +
			c.wk.MustExec("ip", "rule", "show", "lookup", "200")
	}
	before := foreign()
	if strings.Count(before, "\n") != 3 {
		t.Fatalf("foreign route and rules not all in place:\n%s", before)
	}
	c.applyBoth(t)
	runIn(t, c.wk, c.fabrics[c.wk], wkLogs)
	runIn(t, c.gw, c.fabrics[c.gw], gwLogs)
	table := fmt.Sprint(fabric.DefaultTable)
	nftHas := func(s *harness.Site, want ...string) func() error {
		return func() error {
			out, err := s.Exec(context.Background(), "nft", "list", "table", "ip", fabric.DefaultNFTable)
			for _, w := range want {
				if err != nil || !strings.Contains(string(out), w) {
					return fmt.Errorf("want %q in: %s %v", w, out, err)
				}
			}
			return nil
		}
	}
	routeIs := func(s *harness.Site, dst, want string) func() error {
		return func() error {
			out := s.MustExec("ip", "route", "show", dst, "table", table)
			if !strings.Contains(out, want) || !strings.Contains(out, "proto 102") {
				return fmt.Errorf("route to %s in table %s: %q, want %q with proto 102", dst, table, out, want)
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name   string
		site   *harness.Site
		break_ [][]string
		back   func() error
	}{
		{"route deleted", c.wk, [][]string{{"ip", "route", "del", view.String(), "table", table}},
			routeIs(c.wk, view.String(), "via "+c.gw.Addr.String())},
		{"route changed", c.wk, [][]string{{"ip", "route", "replace", view.String(), "via", "198.18.1.99", "dev", "lan0", "table", table, "proto", "102"}},
			routeIs(c.wk, view.String(), "via "+c.gw.Addr.String())},
		{"route lost with its link", c.wk, [][]string{{"ip", "link", "set", "lan0", "down"}, {"ip", "link", "set", "lan0", "up"}},
			routeIs(c.wk, view.String(), "via "+c.gw.Addr.String())},
		{"rule deleted", c.wk, [][]string{{"ip", "rule", "del", "priority", "20000", "lookup", table}},
			func() error {
				if out := c.wk.MustExec("ip", "rule", "show", "priority", "20000", "lookup", table); !strings.Contains(out, "proto 102") {
					return fmt.Errorf("rule: %q", out)
				}
				return nil
			}},
		{"nftables table deleted", c.wk, [][]string{{"nft", "delete", "table", "ip", fabric.DefaultNFTable}},
			nftHas(c.wk, "10.70.0.0/16", "ip daddr @views snat to ip saddr", "ip saddr @views snat to ip saddr")},
		{"view element deleted", c.wk, [][]string{{"nft", "delete", "element", "ip", fabric.DefaultNFTable, "views", "{ 10.70.0.0/16 }"}},
			nftHas(c.wk, "10.70.0.0/16")},
		{"rule flushed from the chain", c.wk, [][]string{{"nft", "flush", "chain", "ip", fabric.DefaultNFTable, "exempt"}},
			nftHas(c.wk, "ip daddr @views snat to ip saddr", "ip saddr @views snat to ip saddr")},
		{"gateway's route to a node deleted", c.gw, [][]string{{"ip", "route", "del", wkBlock.String(), "table", table}},
			routeIs(c.gw, wkBlock.String(), "via "+c.wk.Addr.String())},
		{"gateway's rule deleted", c.gw, [][]string{{"ip", "rule", "del", "priority", "20000", "iif", tunnelLink, "lookup", table}},
			func() error {
				if out := c.gw.MustExec("ip", "rule", "show", "priority", "20000"); !strings.Contains(out, "iif "+tunnelLink) {
					return fmt.Errorf("rule: %q", out)
				}
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.back(); err != nil {
				t.Fatalf("before: %v", err)
			}
			for _, cmd := range tc.break_ {
				tc.site.MustExec(cmd[0], cmd[1:]...)
			}
			eventually.Within(t, 10*time.Second, tc.name+", repaired", tc.back)
		})
	}
	if _, err := c.seen(peerAddr); err != nil {
		t.Errorf("pod to the peer after the repairs: %v", err)
	}
	if after := foreign(); after != before {
		t.Errorf("foreign route and rules changed by the repairs:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := counterValue(t, wkReg, "flotilla_fabric_repairs_total"); n < 7 {
		t.Errorf("flotilla_fabric_repairs_total on the worker = %v, want at least 7", n)
	}
}

// counterValue returns the value of a metric with the labels given as
// name, value pairs, 0 if absent.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, _ := metricValue(t, reg, name, labels...)
	return v
}

// metricValue returns the value of a metric with the labels given as
// name, value pairs, and whether there is one.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// records is a slog.Handler that keeps every record, for tests to read.
type records struct {
	mu   sync.Mutex
	recs []string // message, then attrs
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
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, b.String())
	r.lvls = append(r.lvls, rec.Level)
	return nil
}

// count returns how many records of level start with msg and contain
// attr ("key=value").
func (r *records) count(level slog.Level, msg, attr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i, s := range r.recs {
		if r.lvls[i] == level && strings.HasPrefix(s, msg) && strings.Contains(s, attr) {
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
