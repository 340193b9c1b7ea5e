package peering

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

var (
	slash8   = netip.MustParsePrefix("10.0.0.0/8")
	block0   = netip.MustParsePrefix("10.0.0.0/24")
	block1   = netip.MustParsePrefix("10.0.1.0/24")
	pair     = netip.MustParsePrefix("10.0.0.0/23") // block0 and block1
	flannel  = netip.MustParsePrefix("10.244.0.0/16")
	upper9   = netip.MustParsePrefix("10.128.0.0/9") // holds flannel's range
	blocksOf = func(ps ...netip.Prefix) []netip.Prefix { return ps }
)

// tunnelViews are the views of id's networks in n's data path, and the
// views id has of n's networks there (its NAT).
func tunnelViews(n *node, id string) (views, ofMe []tunnel.View) {
	p, _ := n.dp.peer(id)
	return p.Views, p.ViewsOfMe
}

func realsOf(vs []tunnel.View) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range vs {
		out = append(out, v.Real)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// A cluster on a /8 announces its nodes' blocks and changes them at run
// time: the peer gives each new block a view and releases, to quarantine,
// the view of a block no longer announced; both data paths follow, and
// the tunnel stays up throughout.
func TestChangedNetworksReallocateAndRelease(t *testing.T) {
	net := &network{}
	a := newNode(t, net, nodeOptions{networks: blocksOf(block0), locals: blocksOf(slash8)})
	b := newNode(t, net, nodeOptions{networks: blocksOf(flannel)})
	aID := a.id.ClusterID()
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })

	// Wait until each side's data path holds exactly want of a's networks.
	follows := func(what string, want []netip.Prefix) {
		t.Helper()
		within(t, what, func() error {
			views, _ := tunnelViews(b, aID)
			_, ofMe := tunnelViews(a, b.id.ClusterID())
			d, _ := a.dp.desired()
			if got := realsOf(views); !slices.Equal(got, want) {
				return fmt.Errorf("b's views of a: %v", views)
			}
			if got := realsOf(ofMe); !slices.Equal(got, want) {
				return fmt.Errorf("a's NAT (b's views of it): %v", ofMe)
			}
			if !slices.Equal(d.Networks, want) {
				return fmt.Errorf("a's data path networks %v", d.Networks)
			}
			if s := stateOf(a, b); len(s.MyNetworks) != len(want) {
				return fmt.Errorf("a's Peer of b lists %v as its networks", s.MyNetworks)
			}
			return nil
		})
	}

	if err := a.eng.SetNetworks(blocksOf(block0, block1)); err != nil {
		t.Fatal(err)
	}
	follows("a node's block appears", blocksOf(block0, block1))
	var view1 netip.Prefix
	for _, v := range b.ledger.Views(aID) {
		if v.Remote == block1 {
			view1 = v.View
		}
	}
	if !view1.IsValid() {
		t.Fatalf("b's ledger has no view of a's new block: %v", b.ledger.Views(aID))
	}

	// Aggregated: b's claims about the two blocks give way to one about
	// the /23 that holds both.
	if err := a.eng.SetNetworks(blocksOf(pair)); err != nil {
		t.Fatal(err)
	}
	probe := netip.MustParseAddr("10.0.1.9")
	seen, _ := b.ledger.ToLocal(aID, probe)
	follows("blocks aggregated", blocksOf(pair))
	if now, _ := b.ledger.ToLocal(aID, probe); now != seen {
		t.Errorf("b saw a's %s as %s, after aggregation as %s", probe, seen, now)
	}
	if err := a.eng.SetNetworks(blocksOf(block0, block1)); err != nil {
		t.Fatal(err)
	}
	follows("blocks apart again", blocksOf(block0, block1))
	for _, v := range b.ledger.Views(aID) {
		if v.Remote == block1 {
			view1 = v.View
		}
	}

	if err := a.eng.SetNetworks(blocksOf(block0)); err != nil {
		t.Fatal(err)
	}
	follows("a node's block goes", blocksOf(block0))
	if q := b.ledger.Quarantine(); !slices.ContainsFunc(q, func(q ipam.Quarantined) bool {
		return q.Peer == aID && q.Remote == block1 && q.Block == view1
	}) {
		t.Errorf("the view %s of a's block %s that went is not in b's quarantine: %v", view1, block1, q)
	}
	if slices.ContainsFunc(b.ledger.Views(aID), func(v ipam.View) bool { return v.Remote == block1 }) {
		t.Errorf("b still has a view of a's block that went: %v", b.ledger.Views(aID))
	}
	if n := a.dp.removals(b.id.ClusterID()) + b.dp.removals(aID); n != 0 {
		t.Errorf("the tunnel left the data path %d times while the blocks changed", n)
	}
	inPhase(t, a, b, PhaseNegotiating) // configured, agreed; no handshake in this test
}

// SetNetworks refuses what a statement could not carry.
func TestSetNetworksRefusesBadNetworks(t *testing.T) {
	a := newNode(t, &network{}, nodeOptions{})
	many := make([]netip.Prefix, MaxNetworks+1)
	for i := range many {
		many[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), 0}), 24)
	}
	for _, bad := range [][]netip.Prefix{nil, many, blocksOf(block0, slash8), blocksOf(netip.MustParsePrefix("10.0.0.1/24"))} {
		if err := a.eng.SetNetworks(bad); err == nil {
			t.Errorf("SetNetworks(%v) accepted", bad)
		}
	}
}

// countingLedger counts SyncPeer calls: each allocates views.
type countingLedger struct {
	Ledger
	syncs atomic.Int64
}

func (c *countingLedger) Batch(fn func(ipam.Batch) error) error {
	return c.Ledger.Batch(func(b ipam.Batch) error { return fn(countingBatch{b, c}) })
}

type countingBatch struct {
	ipam.Batch
	c *countingLedger
}

func (b countingBatch) SyncPeer(peer string, remotes []netip.Prefix) ([]ipam.View, error) {
	b.c.syncs.Add(1)
	return b.Batch.SyncPeer(peer, remotes)
}

// logCounter counts log records whose message has a prefix.
type logCounter struct {
	prefix string
	mu     sync.Mutex
	n      int
	last   string
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, l.prefix) {
		l.mu.Lock()
		l.n++
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				l.last = a.Value.String()
			}
			return true
		})
		l.mu.Unlock()
	}
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }
func (l *logCounter) count() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.last
}

// A peer announcing a range larger than any remap pool, overlapping ours,
// gets no view: the Peer says why and what to set, the error is logged
// once per change and the allocation is not retried on every reconcile;
// once the peer announces its blocks, they connect.
func TestExhaustedPoolsReportedOncePerChange(t *testing.T) {
	net := &network{}
	var toB atomic.Int64
	logs := &logCounter{prefix: "cannot give the peer a view"}
	ledger := &countingLedger{}
	a := newNode(t, net, nodeOptions{networks: blocksOf(slash8)})
	b := newNode(t, net, nodeOptions{networks: blocksOf(flannel), logger: slog.New(logs),
		ledger: func(l Ledger) Ledger { ledger.Ledger = l; return ledger }})
	net.tap = func(to string, _ []byte) {
		if to == b.id.ClusterID() {
			toB.Add(1)
		}
	}
	meet(a, b)
	// settles waits until b heard at least n more messages from a (each a
	// reconcile of b's engine, the resends every 200 ms included), and
	// returns the SyncPeer calls meanwhile.
	settles := func(n int64) int64 {
		t.Helper()
		from, syncs := toB.Load(), ledger.syncs.Load()
		within(t, fmt.Sprintf("%d more messages to b", n), func() error {
			if got := toB.Load() - from; got < n {
				return fmt.Errorf("%d messages", got)
			}
			return nil
		})
		return ledger.syncs.Load() - syncs
	}
	refused := func(what string, rng netip.Prefix, larger bool) {
		t.Helper()
		within(t, what, func() error {
			s := stateOf(b, a)
			if s.ViewsAgreed.Reason != "PoolExhausted" || !strings.Contains(s.ViewsAgreed.Message, "announces "+rng.String()) {
				return fmt.Errorf("ViewsAgreed %+v", s.ViewsAgreed)
			}
			return nil
		})
		msg := stateOf(b, a).ViewsAgreed.Message
		for _, want := range []string{"100.96.0.0/11, 100.64.0.0/11", "--announce=blocks"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the Peer's reason %q does not say %q", msg, want)
			}
		}
		if larger != strings.Contains(msg, "larger than any remap pool") {
			t.Errorf("the Peer's reason %q: larger than any pool %v, want %v", msg, !larger, larger)
		}
	}

	refused("a's /8 refused", slash8, true)
	if n := settles(10); n != 0 {
		t.Errorf("%d allocations of views tried again over 10 reconciles with nothing changed", n)
	}
	if n, last := logs.count(); n != 1 || !strings.Contains(last, "announces 10.0.0.0/8") {
		t.Errorf("logged %d times (last: %s), want once", n, last)
	}

	// A change to another range too large for the pools (10.128.0.0/9
	// holds b's range): logged again, once.
	if err := a.eng.SetNetworks(blocksOf(upper9)); err != nil {
		t.Fatal(err)
	}
	refused("a's /9 refused", upper9, true)
	settles(10)
	if n, _ := logs.count(); n != 2 {
		t.Errorf("logged %d times after one change, want 2", n)
	}

	// a announces its blocks: they connect.
	if err := a.eng.SetNetworks(blocksOf(block0, block1)); err != nil {
		t.Fatal(err)
	}
	within(t, "connected by blocks", func() error {
		views, _ := tunnelViews(b, a.id.ClusterID())
		_, ofMe := tunnelViews(a, b.id.ClusterID())
		if !slices.Equal(realsOf(views), blocksOf(block0, block1)) || !slices.Equal(views, ofMe) {
			return fmt.Errorf("b's views of a %v, a's record of them %v", views, ofMe)
		}
		return nil
	})
	if s := stateOf(b, a); !s.ViewsAgreed.OK {
		t.Errorf("ViewsAgreed %+v after a announced its blocks", s.ViewsAgreed)
	}
	if n, _ := logs.count(); n != 2 {
		t.Errorf("logged %d times, want 2", n)
	}
}
