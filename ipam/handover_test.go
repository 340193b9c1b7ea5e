package ipam

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

// A cluster back under a new identity (its state directory lost) is seen
// here at the addresses it had: the old identity's views, and what it
// already had in quarantine, pass to the new one, which takes the same
// blocks for the same ranges, and nobody else has them meanwhile.
func TestHandOverGivesTheSuccessorTheSameBlocks(t *testing.T) {
	l, clk := openTest(t, Options{Quarantine: 10 * time.Minute})
	setLocals(t, l, testLocals)
	// x had two ranges, then dropped one: one view, one block quarantined.
	if _, err := l.SyncPeer("x", []netip.Prefix{pfx("10.0.0.0/16"), pfx("10.1.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	before, err := l.SyncPeer("x", []netip.Prefix{pfx("10.0.0.0/16")})
	if err != nil || len(before) != 1 {
		t.Fatalf("SyncPeer(x) = %+v, %v", before, err)
	}
	dropped := l.Quarantine()
	if len(dropped) != 1 || dropped[0].Peer != "x" {
		t.Fatalf("quarantine = %+v, want x's view of 10.1.0.0/16", dropped)
	}
	clk.Advance(time.Minute)
	if err := l.HandOver("x", "y"); err != nil {
		t.Fatal(err)
	}
	if v := l.Views("x"); len(v) != 0 {
		t.Fatalf("x keeps views after the hand-over: %+v", v)
	}
	q := l.Quarantine()
	if len(q) != 2 {
		t.Fatalf("quarantine = %+v, want x's two blocks, now y's", q)
	}
	for _, e := range q {
		if e.Peer != "y" {
			t.Errorf("quarantined %s is %s's, want y's", e.Block, e.Peer)
		}
	}
	// Another peer with the same ranges gets other blocks meanwhile.
	other, err := l.SyncPeer("z", []netip.Prefix{pfx("10.0.0.0/16"), pfx("10.1.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range other {
		for _, e := range q {
			if v.View.Overlaps(e.Block) {
				t.Errorf("z got %s, inside y's quarantined %s", v.View, e.Block)
			}
		}
	}
	after, err := l.SyncPeer("y", []netip.Prefix{pfx("10.0.0.0/16"), pfx("10.1.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Prefix]netip.Prefix{before[0].Remote: before[0].View, dropped[0].Remote: dropped[0].Block}
	for _, v := range after {
		if want[v.Remote] != v.View {
			t.Errorf("y sees %s as %s, x saw it as %s", v.Remote, v.View, want[v.Remote])
		}
	}
	if q := l.Quarantine(); len(q) != 0 {
		t.Fatalf("quarantine after y took its blocks = %+v", q)
	}
	if err := checkInvariants(l); err != nil {
		t.Fatal(err)
	}
	// The hand-over is on file.
	l = reopen(t, l, Options{Quarantine: 10 * time.Minute, Now: clk.Now})
	if got := l.Views("y"); len(got) != 2 {
		t.Fatalf("after a restart y has %+v", got)
	}
}

// A successor that announces other ranges takes, of the old blocks, what
// keeps each address's meaning (inherit), and the rest stays quarantined
// until it ends, as it would have for the old identity.
func TestHandOverKeepsTheQuarantinesEnd(t *testing.T) {
	l, clk := openTest(t, Options{Quarantine: 10 * time.Minute})
	setLocals(t, l, testLocals)
	if _, err := l.SyncPeer("x", []netip.Prefix{pfx("10.0.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	if err := l.ReleasePeer("x"); err != nil {
		t.Fatal(err)
	}
	until := l.Quarantine()[0].Until
	clk.Advance(5 * time.Minute)
	if err := l.HandOver("x", "y"); err != nil {
		t.Fatal(err)
	}
	vs, err := l.SyncPeer("y", []netip.Prefix{pfx("10.0.0.0/17")})
	if err != nil || len(vs) != 1 || vs[0].View != pfx("100.96.0.0/17") {
		t.Fatalf("SyncPeer(y, the first half) = %+v, %v; want the first half of x's 100.96.0.0/16", vs, err)
	}
	q := l.Quarantine()
	if len(q) != 1 || q[0].Block != pfx("100.96.128.0/17") || q[0].Peer != "y" || !q[0].Until.Equal(until) {
		t.Fatalf("quarantine = %+v, want the second half, y's, until %s", q, until)
	}
	clk.Advance(5 * time.Minute)
	if q := l.Quarantine(); len(q) != 0 {
		t.Fatalf("quarantine past its end = %+v", q)
	}
}

func TestHandOverRefusesBadPeers(t *testing.T) {
	l, _ := openTest(t, Options{})
	for _, tc := range []struct{ from, to string }{{"x", "x"}, {"", "y"}, {"x", "bad id"}} {
		if err := l.HandOver(tc.from, tc.to); !errors.Is(err, ErrInvalidPeer) {
			t.Errorf("HandOver(%q, %q) = %v, want ErrInvalidPeer", tc.from, tc.to, err)
		}
	}
}
