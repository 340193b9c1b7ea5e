package fabric_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A kernel event subscription that ends on ENOBUFS (events came faster
// than the fabric read them) is opened again and counted, and a change to
// what we own made afterwards is repaired on its event, with the periodic
// resync an hour away. The overflow is real: the receive buffer is made
// tiny and flooded with events that are not ours. The end is logged once.
func TestResubscribeAfterOverflow(t *testing.T) {
	table := fmt.Sprint(fabric.DefaultTable)
	for _, tc := range []struct {
		kind   string
		flood  func(s *harness.Site, dir string)
		break_ []string
		back   func(s *harness.Site) bool
	}{
		{
			kind: "rtnetlink",
			flood: func(s *harness.Site, dir string) {
				var b strings.Builder
				for i := range 400 {
					fmt.Fprintf(&b, "route add 10.201.%d.%d/32 dev lan0 proto static table 100\n", i/250, i%250)
				}
				b.WriteString("route flush table 100\n")
				batch(s, dir, "ip", "-batch", b.String())
			},
			break_: []string{"ip", "route", "del", view.String(), "table", table},
			back: func(s *harness.Site) bool {
				return strings.Contains(s.MustExec("ip", "route", "show", view.String(), "table", table), "proto 102")
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
			break_: []string{"nft", "delete", "table", "ip", fabric.DefaultNFTable},
			back: func(s *harness.Site) bool {
				out, err := s.Exec(context.Background(), "nft", "list", "table", "ip", fabric.DefaultNFTable)
				return err == nil && strings.Contains(string(out), "snat to ip saddr")
			},
		},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := newCluster(t)
			logs, reg := c.withLogs(t, c.wk)
			f := c.fabrics[c.wk]
			fabric.SetEventBuffer(f, tc.kind, 1) // the smallest the kernel allows: a few messages
			c.apply(t, c.wk, c.workerDesired())
			runIn(t, c.wk, f, logs)

			dir := t.TempDir()
			ended := func() int { return logs.count(slog.LevelWarn, "kernel events ended", "events="+tc.kind) }
			for i := 0; ended() == 0; i++ {
				if i == 20 {
					t.Fatalf("%s events: 20 floods did not overflow a minimal receive buffer", tc.kind)
				}
				tc.flood(c.wk, dir)
			}
			eventually.Within(t, 20*time.Second, "resubscribed", func() error {
				if n := counterValue(t, reg, "flotilla_fabric_resubscribes_total", "kind", tc.kind); n < 1 {
					return fmt.Errorf("flotilla_fabric_resubscribes_total{kind=%q} = %v", tc.kind, n)
				}
				return nil
			})
			c.wk.MustExec(tc.break_[0], tc.break_[1:]...)
			eventually.Within(t, 10*time.Second, fmt.Sprintf("%v repaired after the %s events overflowed", tc.break_, tc.kind), func() error {
				if !tc.back(c.wk) {
					return fmt.Errorf("not back")
				}
				return nil
			})
			if n := ended(); n != 1 {
				t.Errorf("stream end logged %d times, want once:\n%s", n, logs)
			}
		})
	}
}

// batch runs cmd with a file holding script as its last argument.
func batch(s *harness.Site, dir, cmd, flag, script string) {
	f := filepath.Join(dir, "batch")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		panic(err)
	}
	s.MustExec(cmd, flag, f)
}
