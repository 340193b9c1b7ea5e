package ipam

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

// clock is an injectable quarantine clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// openTest opens a fresh ledger in a temporary directory with a fake clock.
func openTest(t testing.TB, opts Options) (*Ledger, *clock) {
	t.Helper()
	c := newClock()
	if opts.Now == nil {
		opts.Now = c.Now
	}
	l, err := Open(filepath.Join(t.TempDir(), FileName), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, c
}

func reopen(t testing.TB, l *Ledger, opts Options) *Ledger {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := Open(l.Path(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

var testLocals = []LocalNetwork{
	{Range: pfx("10.0.0.0/16"), Kind: PodNetwork},
	{Range: pfx("10.96.0.0/12"), Kind: ServiceNetwork},
	{Range: pfx("192.168.1.0/24"), Kind: NodeNetwork},
	{Range: pfx("fd00:10::/56"), Kind: PodNetwork},
}

func setLocals(t testing.TB, l *Ledger, nets []LocalNetwork) {
	t.Helper()
	if c, err := l.SetLocalNetworks(nets); err != nil || len(c) != 0 {
		t.Fatalf("SetLocalNetworks: conflicts %v, err %v", c, err)
	}
}

// checkInvariants verifies what the ledger promises after every step: no
// two views overlap, no view overlaps a local network or a quarantined
// block, and every view is aligned, of its range's family and size.
func checkInvariants(l *Ledger) error {
	views := l.Views("")
	locals := l.LocalNetworks()
	quar := l.Quarantine()
	sort.Slice(views, func(i, j int) bool { return comparePrefix(views[i].View, views[j].View) < 0 })
	for i, v := range views {
		if v.View.Bits() != v.Remote.Bits() || v.View.Addr().Is4() != v.Remote.Addr().Is4() {
			return fmt.Errorf("view %s of %s/%s: not the same size and family", v.View, v.Peer, v.Remote)
		}
		if !aligned(v.View) || v.View.Masked() != v.View {
			return fmt.Errorf("view %s of %s/%s: not aligned", v.View, v.Peer, v.Remote)
		}
		for _, w := range views[i+1:] {
			if overlaps(v.View, w.View) {
				return fmt.Errorf("views overlap: %s (%s %s) and %s (%s %s)", v.View, v.Peer, v.Remote, w.View, w.Peer, w.Remote)
			}
		}
		for _, n := range locals {
			if overlaps(v.View, n.Range) {
				return fmt.Errorf("view %s of %s/%s overlaps local %s", v.View, v.Peer, v.Remote, n.Range)
			}
		}
		for _, q := range quar {
			if overlaps(v.View, q.Block) {
				return fmt.Errorf("view %s of %s/%s overlaps quarantined %s of %s", v.View, v.Peer, v.Remote, q.Block, q.Peer)
			}
		}
		if got, ok := l.ToLocal(v.Peer, v.Remote.Addr()); !ok || got != v.View.Addr() {
			return fmt.Errorf("ToLocal(%s, %s) = %s %v, want %s", v.Peer, v.Remote.Addr(), got, ok, v.View.Addr())
		}
	}
	return nil
}

// seedEnv replays a randomized test: FLOTILLA_TEST_SEED=<seed printed by
// the failed run>.
const seedEnv = "FLOTILLA_TEST_SEED"

// testSeed returns the seed of a randomized test, from seedEnv or the
// clock, and logs it so a failure can be replayed.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(seedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: not a seed: %v", seedEnv, v, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, seedEnv, seed)
	return seed
}
