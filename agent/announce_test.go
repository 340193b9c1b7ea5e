package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
)

// fields are the prefixes in s, separated by spaces.
func fields(s string) []netip.Prefix { return prefixes(strings.Fields(s)...) }

func TestAggregate(t *testing.T) {
	for _, tc := range []struct{ name, blocks, want string }{
		{"one block", "10.0.0.0/24", "10.0.0.0/24"},
		{"two siblings", "10.0.1.0/24 10.0.0.0/24", "10.0.0.0/23"},
		{"four on a /22 boundary", "10.0.0.0/24 10.0.1.0/24 10.0.2.0/24 10.0.3.0/24", "10.0.0.0/22"},
		{"three of four", "10.0.0.0/24 10.0.1.0/24 10.0.2.0/24", "10.0.0.0/23 10.0.2.0/24"},
		{"adjacent, not aligned", "10.0.1.0/24 10.0.2.0/24", "10.0.1.0/24 10.0.2.0/24"},
		{"four adjacent, off the boundary", "10.0.1.0/24 10.0.2.0/24 10.0.3.0/24 10.0.4.0/24", "10.0.1.0/24 10.0.2.0/23 10.0.4.0/24"},
		{"a gap", "10.0.0.0/24 10.0.2.0/24", "10.0.0.0/24 10.0.2.0/24"},
		{"duplicates and one inside another", "10.0.0.0/24 10.0.0.0/24 10.0.0.128/25 10.0.1.0/24", "10.0.0.0/23"},
		{"mixed sizes", "10.0.0.0/25 10.0.0.128/25 10.0.1.0/24", "10.0.0.0/23"},
		{"host bits ignored", "10.0.0.1/24", "10.0.0.0/24"},
		{"IPv6 left out", "fd00::/64 10.0.0.0/24", "10.0.0.0/24"},
		{"the top of the space", "255.255.255.0/24 255.255.254.0/24", "255.255.254.0/23"},
		{"nothing", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := aggregate(fields(tc.blocks))
			if want := fields(tc.want); !slices.Equal(got, want) {
				t.Errorf("aggregate(%s) = %v, want %v", tc.blocks, got, want)
			}
		})
	}
}

// The aggregate covers exactly the blocks' addresses, with prefixes that
// do not overlap and that no two of which could merge into one.
func TestAggregateCoversExactlyTheBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		// Blocks of /22 to /26 in a /20, so they touch and overlap often.
		var blocks []netip.Prefix
		for range rng.IntN(12) {
			bits := 22 + rng.IntN(5)
			off := uint32(rng.IntN(1<<12)) &^ (1<<(32-bits) - 1)
			blocks = append(blocks, netip.PrefixFrom(addr4(0x0a000000+off), bits))
		}
		got := aggregate(blocks)
		if err := coversExactly(got, blocks); err != nil {
			t.Fatalf("round %d: aggregate(%v) = %v: %v", round, blocks, got, err)
		}
	}
}

func FuzzAggregate(f *testing.F) {
	f.Add([]byte{10, 0, 0, 0, 24, 10, 0, 1, 0, 24})
	f.Fuzz(func(t *testing.T, b []byte) {
		var blocks []netip.Prefix
		for ; len(b) >= 5 && len(blocks) < 64; b = b[5:] {
			blocks = append(blocks, netip.PrefixFrom(netip.AddrFrom4([4]byte(b[:4])), 22+int(b[4])%11).Masked())
		}
		got := aggregate(blocks)
		if err := coversExactly(got, blocks); err != nil {
			t.Fatalf("aggregate(%v) = %v: %v", blocks, got, err)
		}
	})
}

// coversExactly checks the aggregate against the blocks address by
// address (they are small), and that it is minimal.
func coversExactly(agg, blocks []netip.Prefix) error {
	in := func(ps []netip.Prefix, a netip.Addr) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	seen := map[netip.Addr]bool{}
	for _, set := range [][]netip.Prefix{agg, blocks} {
		for _, p := range set {
			for a := p.Masked().Addr(); p.Contains(a); a = a.Next() {
				if seen[a] {
					continue
				}
				seen[a] = true
				if in(agg, a) != in(blocks, a) {
					return fmt.Errorf("%s: in the aggregate %v, in the blocks %v", a, in(agg, a), in(blocks, a))
				}
				if !a.Next().IsValid() {
					break
				}
			}
		}
	}
	for i, p := range agg {
		for _, q := range agg[i+1:] {
			if p.Overlaps(q) {
				return fmt.Errorf("%s and %s overlap", p, q)
			}
			if p.Bits() == q.Bits() && p.Bits() > 0 {
				if pp, _ := p.Addr().Prefix(p.Bits() - 1); pp == (func() netip.Prefix { qq, _ := q.Addr().Prefix(q.Bits() - 1); return qq })() {
					return fmt.Errorf("%s and %s should be one /%d", p, q, p.Bits()-1)
				}
			}
		}
	}
	return nil
}

func TestAnnounce(t *testing.T) {
	pools := ipam.DefaultPools
	nodes := "10.0.0.0/24 10.0.1.0/24 10.0.5.0/24 10.244.0.0/24 fd00:1::/64"
	for _, tc := range []struct {
		name   string
		mode   Announce
		ranges string
		blocks string
		want   string
		noted  bool
	}{
		{"auto: a range a pool holds is announced whole", AnnounceAuto, "10.244.0.0/16", nodes, "10.244.0.0/16", false},
		{"auto: a /11 still fits", AnnounceAuto, "10.0.0.0/11", nodes, "10.0.0.0/11", false},
		{"auto: a /8 is announced by its blocks", AnnounceAuto, "10.0.0.0/8", nodes, "10.0.0.0/23 10.0.5.0/24 10.244.0.0/24", false},
		{"auto: a /10 too", AnnounceAuto, "10.0.0.0/10", nodes, "10.0.0.0/23 10.0.5.0/24", false},
		{"auto: no blocks in the range (a CNI with its own IPAM)", AnnounceAuto, "10.0.0.0/8", "192.168.0.0/24", "10.0.0.0/8", true},
		{"range: whole, whatever its size", AnnounceRange, "10.0.0.0/8", nodes, "10.0.0.0/8", false},
		{"blocks: even of a small range", AnnounceBlocks, "10.244.0.0/16", nodes, "10.244.0.0/24", false},
		{"blocks: without blocks, the range", AnnounceBlocks, "10.244.0.0/16", "", "10.244.0.0/16", true},
		{"blocks of each range", AnnounceBlocks, "10.0.0.0/16 10.244.0.0/16", nodes, "10.0.0.0/23 10.0.5.0/24 10.244.0.0/24", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := announce(tc.mode, fields(tc.ranges), fields(tc.blocks), pools)
			if want := fields(tc.want); !slices.Equal(got.Networks, want) {
				t.Errorf("announced %v, want %v", got.Networks, want)
			}
			if noted := len(got.Notes) > 0; noted != tc.noted {
				t.Errorf("notes %q, want some: %v", got.Notes, tc.noted)
			}
		})
	}
}

// More blocks than a statement carries, even aggregated: the range, and
// the note says why.
func TestAnnounceTooManyBlocks(t *testing.T) {
	var blocks []netip.Prefix
	for i := range peering.MaxNetworks + 1 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], 0x0a000000+uint32(i)<<9) // every other /24: nothing merges
		blocks = append(blocks, netip.PrefixFrom(netip.AddrFrom4(b), 24))
	}
	r := fields("10.0.0.0/8")
	got := announce(AnnounceAuto, r, blocks, ipam.DefaultPools)
	if !slices.Equal(got.Networks, r) || len(got.Notes) != 1 || !strings.Contains(got.Notes[0], "more than the 64") {
		t.Fatalf("announced %v (%q), want the range and why", got.Networks, got.Notes)
	}
	got = announce(AnnounceAuto, r, blocks[:peering.MaxNetworks], ipam.DefaultPools)
	if len(got.Networks) != peering.MaxNetworks || len(got.Notes) != 0 {
		t.Fatalf("64 blocks: announced %d networks (%q), want the 64 blocks", len(got.Networks), got.Notes)
	}
}

// A burst of Node changes is one renegotiation, and a look that changes
// nothing is none.
func TestAnnouncerDebouncesABurst(t *testing.T) {
	var mu sync.Mutex
	blocks := fields("10.0.0.0/24")
	n := newAnnouncer(slog.New(slog.DiscardHandler), AnnounceAuto, fields("10.0.0.0/8"))
	n.blocks = func() ([]netip.Prefix, string) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(blocks), sourceNodes
	}
	if first, _ := n.current(); !slices.Equal(first.Networks, fields("10.0.0.0/24")) {
		t.Fatalf("announced %v at start", first.Networks)
	}
	sets := make(chan []netip.Prefix, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- n.run(ctx, func(p []netip.Prefix) error { sets <- p; return nil }) }()
	t.Cleanup(func() { cancel(); <-done })
	// Three nodes register one after another, each a notification.
	for _, b := range []string{"10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24"} {
		mu.Lock()
		blocks = append(blocks, netip.MustParsePrefix(b))
		mu.Unlock()
		n.notify()
	}
	if got := <-sets; !slices.Equal(got, fields("10.0.0.0/22")) {
		t.Fatalf("renegotiated %v, want the /22", got)
	}
	// A change of nothing announced (a Node's address, say): no call.
	// Witness: a real change after it is the next call.
	n.notify()
	time.Sleep(2 * announceDebounce)
	mu.Lock()
	blocks = blocks[1:]
	mu.Unlock()
	n.notify()
	if got := <-sets; !slices.Equal(got, fields("10.0.1.0/24 10.0.2.0/23")) {
		t.Fatalf("renegotiated %v after a block went", got)
	}
}

// The gateway host's source stays inside what is announced: with blocks,
// its node's own block is among them.
func TestHostSourceInsideAnnouncedBlocks(t *testing.T) {
	nodes := []fabricapi.Node{
		{Name: "w1", PodCIDRs: fields("10.0.0.0/24")},
		{Name: "gw", PodCIDRs: fields("10.0.1.0/24")},
		{Name: "w2", PodCIDRs: fields("10.0.2.0/24")},
	}
	var blocks []netip.Prefix
	for _, n := range nodes {
		blocks = append(blocks, n.PodCIDRs...)
	}
	f := &fabricPlan{gatewayNode: "gw", nodes: func() []fabricapi.Node { return nodes }}
	for _, mode := range []Announce{AnnounceAuto, AnnounceBlocks, AnnounceRange} {
		a := announce(mode, fields("10.0.0.0/8"), blocks, ipam.DefaultPools)
		if got := f.hostSource(a.Networks); got != netip.MustParseAddr("10.0.1.1") {
			t.Errorf("%s: announced %v, the host's source is %v, want 10.0.1.1", mode, a.Networks, got)
		}
	}
}
