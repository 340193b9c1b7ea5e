package ipam

import (
	"net/netip"
	"slices"
	"testing"
)

// A peer that announces its nodes' blocks re-aggregates them as nodes come
// and go: two /24s become a /23, a /22 splits in two. Each address it
// keeps is seen here as before, remapped or not, so no connection to it
// breaks; what it no longer has stays in quarantine, and nobody else gets
// it meanwhile.
func TestSplitAndMergeKeepAddresses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		locals []LocalNetwork
	}{
		{"views are the ranges", []LocalNetwork{{Range: pfx("10.244.0.0/16"), Kind: PodNetwork}}},
		{"views are remapped", []LocalNetwork{{Range: pfx("10.0.0.0/8"), Kind: PodNetwork}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := openTest(t, Options{noSync: true})
			setLocals(t, l, tc.locals)
			probes := []netip.Addr{netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.1.9"), netip.MustParseAddr("10.0.2.200")}
			seen := map[netip.Addr]netip.Addr{}
			steps := [][]netip.Prefix{
				{pfx("10.0.0.0/24"), pfx("10.0.1.0/24")},
				{pfx("10.0.0.0/23")},                     // merged
				{pfx("10.0.0.0/23"), pfx("10.0.2.0/24")}, // a block more
				{pfx("10.0.0.0/22")},                     // merged with a block never seen
				{pfx("10.0.0.0/24"), pfx("10.0.2.0/23")}, // split: 10.0.1.0/24 went
				{pfx("10.0.0.0/23"), pfx("10.0.2.0/23")}, // it came back
			}
			for i, ranges := range steps {
				if _, err := l.SyncPeer("a", ranges); err != nil {
					t.Fatalf("step %d: SyncPeer(%v): %v", i, ranges, err)
				}
				if err := checkInvariants(l); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for _, ip := range probes {
					local, ok := l.ToLocal("a", ip)
					if !ok {
						continue
					}
					if before, had := seen[ip]; had && before != local {
						t.Errorf("step %d (%v): a's %s is seen as %s, was %s", i, ranges, ip, local, before)
					}
					seen[ip] = local
				}
				if i == 4 {
					q := l.Quarantine()
					i := slices.IndexFunc(q, func(q Quarantined) bool { return q.Peer == "a" && q.Remote == pfx("10.0.1.0/24") })
					if i < 0 {
						t.Fatalf("the view of the block that went is not in quarantine: %+v", q)
					}
					gone, _ := l.ToLocal("a", probes[1])
					if gone.IsValid() {
						t.Fatalf("a's %s still has a view: %s", probes[1], gone)
					}
					v, err := l.ViewOf("b", pfx("10.0.1.0/24"))
					if err != nil || v.Overlaps(q[i].Block) {
						t.Fatalf("another peer's 10.0.1.0/24 is seen as %s (%v), inside the quarantined %s", v, err, q[i].Block)
					}
					if err := l.ReleasePeer("b"); err != nil {
						t.Fatal(err)
					}
				}
			}
			if len(seen) != len(probes) {
				t.Fatalf("probes seen: %v", seen)
			}
		})
	}
}

// A view that cannot keep its addresses (the old blocks are not aligned
// for the merged range) is allocated afresh, as before.
func TestMergeOfUnalignedViewsIsFresh(t *testing.T) {
	l, _ := openTest(t, Options{noSync: true})
	setLocals(t, l, []LocalNetwork{{Range: pfx("10.0.0.0/8"), Kind: PodNetwork}})
	// Peer b takes 100.96.0.0/24 first, so a's views start at 100.96.1.0.
	if _, err := l.ViewOf("b", pfx("10.9.0.0/24")); err != nil {
		t.Fatal(err)
	}
	vs, err := l.SyncPeer("a", []netip.Prefix{pfx("10.0.0.0/24"), pfx("10.0.1.0/24")})
	if err != nil || vs[0].View != pfx("100.96.1.0/24") || vs[1].View != pfx("100.96.2.0/24") {
		t.Fatalf("SyncPeer = %+v, %v", vs, err)
	}
	vs, err = l.SyncPeer("a", []netip.Prefix{pfx("10.0.0.0/23")})
	if err != nil || vs[0].View != pfx("100.96.4.0/23") {
		t.Fatalf("merged: %+v, %v; want a fresh 100.96.4.0/23", vs, err)
	}
	if err := checkInvariants(l); err != nil {
		t.Fatal(err)
	}
}
