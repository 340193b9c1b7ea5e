package ipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestViewOfOverlaps(t *testing.T) {
	type req struct{ peer, remote string }
	tests := []struct {
		name    string
		locals  []LocalNetwork // testLocals when nil
		pools   []netip.Prefix // DefaultPools when nil
		before  []req          // mapped first, must succeed
		req     req
		want    string // the view, or
		wantErr error  // the error class
		errText string // and words the error must contain
	}{
		{name: "disjoint range is its own view", req: req{"a", "10.1.0.0/16"}, want: "10.1.0.0/16"},
		{name: "adjacent to my PodCIDR is its own view", req: req{"a", "10.1.0.0/24"}, want: "10.1.0.0/24"},
		{name: "identical to my PodCIDR is remapped", req: req{"a", "10.0.0.0/16"}, want: "100.96.0.0/16"},
		{name: "nested in my PodCIDR is remapped", req: req{"a", "10.0.5.0/24"}, want: "100.96.0.0/24"},
		{name: "inside my ServiceCIDR is remapped", req: req{"a", "10.100.0.0/16"}, want: "100.96.0.0/16"},
		{name: "inside my node network is remapped", req: req{"a", "192.168.1.128/25"}, want: "100.96.0.0/25"},
		{name: "containing my PodCIDR needs a block the pool cannot hold",
			req: req{"a", "10.0.0.0/8"}, wantErr: ErrExhausted, errText: "no free /8 in 100.96.0.0/11, 100.64.0.0/11"},
		{name: "two peers with the same range: the second is remapped",
			before: []req{{"a", "10.1.0.0/16"}}, req: req{"b", "10.1.0.0/16"}, want: "100.96.0.0/16"},
		{name: "third peer with my range takes the next block",
			before: []req{{"a", "10.0.0.0/16"}, {"b", "10.0.0.0/16"}}, req: req{"c", "10.0.0.0/16"}, want: "100.98.0.0/16"},
		{name: "peer range equal to another peer's view is remapped",
			before: []req{{"a", "10.0.0.0/16"}}, req: req{"b", "100.96.0.0/16"}, want: "100.97.0.0/16"},
		{name: "smaller block first, larger one aligned past it",
			before: []req{{"a", "10.0.0.0/24"}}, req: req{"b", "10.0.0.0/16"}, want: "100.97.0.0/16"},
		{name: "larger block first, smaller one after it",
			before: []req{{"a", "10.0.0.0/16"}}, req: req{"b", "10.0.0.0/24"}, want: "100.97.0.0/24"},
		{name: "pool block overlapping a local network is skipped",
			locals: append([]LocalNetwork{{Range: pfx("100.96.0.0/16"), Kind: NodeNetwork}}, testLocals...),
			req:    req{"a", "10.0.0.0/16"}, want: "100.97.0.0/16"},
		{name: "second pool used when the first is full",
			pools:  []netip.Prefix{pfx("100.96.0.0/16"), pfx("100.64.0.0/16")},
			before: []req{{"a", "10.0.0.0/16"}}, req: req{"b", "10.0.0.0/16"}, want: "100.64.0.0/16"},
		{name: "pool exhaustion names the pools and the size",
			pools:  []netip.Prefix{pfx("100.96.0.0/15")},
			before: []req{{"a", "10.0.0.0/16"}, {"b", "10.0.0.0/16"}}, req: req{"c", "10.0.0.0/16"},
			wantErr: ErrExhausted, errText: "no free /16 in 100.96.0.0/15 (IPv4)"},
		{name: "IPv6 range identical to mine is remapped into the ULA pool",
			req: req{"a", "fd00:10::/56"}, want: "fddc:467:9000::/56"},
		{name: "IPv6 disjoint range is its own view", req: req{"a", "fd00:20::/56"}, want: "fd00:20::/56"},
		{name: "no pool of the family",
			pools: []netip.Prefix{pfx("100.96.0.0/11")}, req: req{"a", "fd00:10::/64"},
			wantErr: ErrExhausted, errText: "no IPv6 pool configured for a /64"},
		{name: "a peer's own ranges may not overlap",
			before: []req{{"a", "10.1.0.0/16"}}, req: req{"a", "10.1.2.0/24"},
			wantErr: ErrInvalidRange, errText: "overlaps the peer's range 10.1.0.0/16"},
		{name: "same range twice is the same view",
			before: []req{{"a", "10.0.0.0/16"}}, req: req{"a", "10.0.0.0/16"}, want: "100.96.0.0/16"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := openTest(t, Options{Pools: tc.pools})
			locals := tc.locals
			if locals == nil {
				locals = testLocals
			}
			setLocals(t, l, locals)
			for _, r := range tc.before {
				if _, err := l.ViewOf(r.peer, pfx(r.remote)); err != nil {
					t.Fatalf("ViewOf(%s, %s): %v", r.peer, r.remote, err)
				}
			}
			got, err := l.ViewOf(tc.req.peer, pfx(tc.req.remote))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("ViewOf = %v, %v; want error %v containing %q", got, err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil || got != pfx(tc.want) {
				t.Fatalf("ViewOf = %v, %v; want %s", got, err, tc.want)
			}
			if err := checkInvariants(l); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestViewOfIsStableAcrossRestarts(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	want := map[string]netip.Prefix{}
	for _, p := range []string{"a", "b", "c"} {
		v, err := l.ViewOf(p, pfx("10.0.0.0/16"))
		if err != nil {
			t.Fatal(err)
		}
		want[p] = v
	}
	l = reopen(t, l, Options{})
	for p, w := range want {
		if got, err := l.ViewOf(p, pfx("10.0.0.0/16")); err != nil || got != w {
			t.Errorf("after reopen ViewOf(%s) = %v, %v; want %v", p, got, err, w)
		}
		if got, ok := l.ToLocal(p, netip.MustParseAddr("10.0.3.4")); !ok || !w.Contains(got) {
			t.Errorf("after reopen ToLocal(%s) = %v %v; want inside %v", p, got, ok, w)
		}
	}
}

func TestReleaseQuarantinesThenReuses(t *testing.T) {
	l, clk := openTest(t, Options{Quarantine: 10 * time.Minute})
	setLocals(t, l, testLocals)
	mustView := func(l *Ledger, peer string) netip.Prefix {
		t.Helper()
		v, err := l.ViewOf(peer, pfx("10.0.0.0/16"))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := mustView(l, "a"); v != pfx("100.96.0.0/16") {
		t.Fatalf("a got %v", v)
	}
	if err := l.Release("a", pfx("10.0.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.ToLocal("a", netip.MustParseAddr("10.0.0.1")); ok {
		t.Error("released view still translates")
	}
	if q := l.Quarantine(); len(q) != 1 || q[0].Block != pfx("100.96.0.0/16") || q[0].Until != clk.Now().Add(10*time.Minute) {
		t.Fatalf("quarantine = %+v", q)
	}
	// Quarantine survives a restart.
	l = reopen(t, l, Options{Quarantine: 10 * time.Minute, Now: clk.Now})
	if v := mustView(l, "b"); v != pfx("100.97.0.0/16") {
		t.Fatalf("b during quarantine got %v, want 100.97.0.0/16", v)
	}
	clk.Advance(10 * time.Minute)
	if v := mustView(l, "c"); v != pfx("100.96.0.0/16") {
		t.Fatalf("c after quarantine got %v, want the released 100.96.0.0/16", v)
	}
	if q := l.Quarantine(); len(q) != 0 {
		t.Fatalf("quarantine after expiry = %+v", q)
	}
	if err := checkInvariants(l); err != nil {
		t.Fatal(err)
	}
}

func TestPeerGetsItsQuarantinedViewBack(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	v1, _ := l.ViewOf("a", pfx("10.0.0.0/16"))
	if err := l.ReleasePeer("a"); err != nil {
		t.Fatal(err)
	}
	v2, err := l.ViewOf("a", pfx("10.0.0.0/16"))
	if err != nil || v2 != v1 {
		t.Fatalf("re-peered a got %v, %v; want its old %v", v2, err, v1)
	}
	if q := l.Quarantine(); len(q) != 0 {
		t.Fatalf("quarantine = %+v", q)
	}
}

func TestReleaseUnknownViewIsNotFound(t *testing.T) {
	l, _ := openTest(t, Options{})
	if err := l.Release("a", pfx("10.0.0.0/16")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Release = %v, want ErrNotFound", err)
	}
}

func TestSyncPeerQuarantinesChangedRange(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	vs, err := l.SyncPeer("a", []netip.Prefix{pfx("10.0.0.0/16"), pfx("172.20.0.0/16")})
	if err != nil || len(vs) != 2 || vs[0].View != pfx("100.96.0.0/16") || vs[1].View != pfx("172.20.0.0/16") {
		t.Fatalf("SyncPeer = %+v, %v", vs, err)
	}
	// The peer's pod range changes from 10.0.0.0/16 to 10.0.0.0/17: its
	// addresses keep their view (the first half of the old one), and the
	// half it no longer has goes to quarantine.
	vs, err = l.SyncPeer("a", []netip.Prefix{pfx("10.0.0.0/17"), pfx("172.20.0.0/16")})
	if err != nil || len(vs) != 2 || vs[0].View != pfx("100.96.0.0/17") || vs[1].View != pfx("172.20.0.0/16") {
		t.Fatalf("SyncPeer after change = %+v, %v", vs, err)
	}
	if q := l.Quarantine(); len(q) != 1 || q[0].Block != pfx("100.96.128.0/17") || q[0].Remote != pfx("10.0.128.0/17") {
		t.Fatalf("quarantine = %+v", q)
	}
	if got := l.Views("a"); len(got) != 2 {
		t.Fatalf("views = %+v", got)
	}
}

func TestViewsOfBatchIsAllOrNothing(t *testing.T) {
	l, _ := openTest(t, Options{Pools: []netip.Prefix{pfx("100.96.0.0/15")}})
	setLocals(t, l, testLocals)
	reqs := []ViewRequest{{"a", pfx("10.0.0.0/16")}, {"b", pfx("10.0.0.0/16")}, {"b", pfx("10.5.0.0/16")}}
	vs, err := l.ViewsOf(reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"100.96.0.0/16", "100.97.0.0/16", "10.5.0.0/16"}
	for i, v := range vs {
		if v.View != pfx(want[i]) || v.Peer != reqs[i].Peer || v.Remote != reqs[i].Remote {
			t.Errorf("view %d = %+v, want %s", i, v, want[i])
		}
	}
	_, err = l.ViewsOf([]ViewRequest{{"c", pfx("10.7.0.0/16")}, {"d", pfx("10.0.0.0/16")}})
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "peer d") {
		t.Fatalf("exhausting batch = %v", err)
	}
	if got := l.Views("c"); len(got) != 0 {
		t.Fatalf("failed batch left views behind: %+v", got)
	}
}

func TestBadInputIsRejectedWithTheReason(t *testing.T) {
	tests := []struct {
		name, peer string
		remote     netip.Prefix
		want       string
	}{
		{"host bits set", "a", netip.PrefixFrom(netip.MustParseAddr("10.0.0.1"), 16), "host bits set; the network is 10.0.0.0/16"},
		{"zero prefix", "a", netip.Prefix{}, "not a valid prefix"},
		{"whole space", "a", pfx("0.0.0.0/0"), "covers the whole address space"},
		{"IPv4-mapped", "a", pfx("::ffff:10.0.0.0/112"), "IPv4-mapped"},
		{"empty peer", "", pfx("10.0.0.0/16"), "want 1 to 253 characters"},
		{"peer with a space", "a b", pfx("10.0.0.0/16"), "not printable ASCII"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := openTest(t, Options{})
			_, err := l.ViewOf(tc.peer, tc.remote)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ViewOf = %v, want error containing %q", err, tc.want)
			}
			if got := l.Views(""); len(got) != 0 {
				t.Fatalf("rejected input left views: %+v", got)
			}
		})
	}
	if _, err := ParseRange("10.0.0.0/33"); !errors.Is(err, ErrInvalidRange) {
		t.Errorf("ParseRange(10.0.0.0/33) = %v", err)
	}
}

func TestLocalNetworkChangeReportsConflicts(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	if v, _ := l.ViewOf("a", pfx("10.1.0.0/16")); v != pfx("10.1.0.0/16") {
		t.Fatalf("a got %v", v)
	}
	conflicts, err := l.SetLocalNetworks(append([]LocalNetwork{{Range: pfx("10.1.128.0/17"), Kind: ReservedNetwork}}, testLocals...))
	if err != nil {
		t.Fatal(err)
	}
	if len(conflicts) != 1 || conflicts[0].View.Peer != "a" || conflicts[0].Local.Range != pfx("10.1.128.0/17") {
		t.Fatalf("conflicts = %v", conflicts)
	}
	if !strings.Contains(conflicts[0].String(), "view 10.1.0.0/16 of peer a range 10.1.0.0/16 overlaps local reserved network 10.1.128.0/17") {
		t.Errorf("conflict reads %q", conflicts[0])
	}
	v, err := l.Remap("a", pfx("10.1.0.0/16"))
	if err != nil || v != pfx("100.96.0.0/16") {
		t.Fatalf("Remap = %v, %v", v, err)
	}
	if c := l.Conflicts(); len(c) != 0 {
		t.Fatalf("conflicts after remap = %v", c)
	}
	if err := checkInvariants(l); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetLocalNetworks([]LocalNetwork{{Range: pfx("10.0.0.0/16"), Kind: "bogus"}}); err == nil || !strings.Contains(err.Error(), `unknown kind "bogus"`) {
		t.Errorf("bogus kind: %v", err)
	}
}

func TestTheirViewClaims(t *testing.T) {
	tests := []struct {
		name         string
		before       [][2]string // mine, theirs
		mine, theirs string
		want         string // error text, "" for success
	}{
		{name: "same size accepted", mine: "10.0.0.0/16", theirs: "10.70.0.0/16"},
		{name: "identity accepted", mine: "10.0.0.0/16", theirs: "10.0.0.0/16"},
		{name: "different size", mine: "10.0.0.0/16", theirs: "10.70.0.0/24", want: "sizes differ (/16 vs /24)"},
		{name: "different family", mine: "10.0.0.0/16", theirs: "fd00::/16", want: "10.0.0.0/16 is IPv4 but fd00::/16 is IPv6"},
		{name: "not one of my networks", mine: "10.1.0.0/16", theirs: "10.70.0.0/16", want: "not within any of our local networks"},
		{name: "overlaps their view of another of my ranges",
			before: [][2]string{{"10.96.0.0/12", "10.64.0.0/12"}}, mine: "10.0.0.0/16", theirs: "10.70.0.0/16",
			want: "10.70.0.0/16 overlaps 10.64.0.0/12, the peer's view of our 10.96.0.0/12"},
		{name: "overlapping mine with another claim",
			before: [][2]string{{"10.0.0.0/16", "10.70.0.0/16"}}, mine: "10.0.0.0/24", theirs: "10.80.0.0/24",
			want: "10.0.0.0/24 overlaps 10.0.0.0/16"},
		{name: "new claim for the same range replaces the old",
			before: [][2]string{{"10.0.0.0/16", "10.70.0.0/16"}}, mine: "10.0.0.0/16", theirs: "10.71.0.0/16"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := openTest(t, Options{})
			setLocals(t, l, testLocals)
			for _, b := range tc.before {
				if err := l.RecordTheirView("p", pfx(b[0]), pfx(b[1])); err != nil {
					t.Fatal(err)
				}
			}
			err := l.RecordTheirView("p", pfx(tc.mine), pfx(tc.theirs))
			if tc.want != "" {
				if !errors.Is(err, ErrInconsistentClaim) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("RecordTheirView = %v, want ErrInconsistentClaim with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, v := range l.TheirViews("p") {
				if v.Mine == pfx(tc.mine) {
					found = v.Theirs == pfx(tc.theirs)
				}
			}
			if !found {
				t.Fatalf("claim not recorded: %+v", l.TheirViews("p"))
			}
		})
	}
}

func TestOtherPeersMaySeeMeUnderTheSameRange(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	for _, p := range []string{"a", "b"} {
		if err := l.RecordTheirView(p, pfx("10.0.0.0/16"), pfx("10.70.0.0/16")); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.ReleasePeer("a"); err != nil {
		t.Fatal(err)
	}
	if got := l.TheirViews(""); len(got) != 1 || got[0].Peer != "b" {
		t.Fatalf("their views after unpeering a = %+v", got)
	}
}

func TestTranslation(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	for _, r := range []string{"10.0.0.0/16", "fd00:10::/56", "172.20.0.0/16"} {
		if _, err := l.ViewOf("b", pfx(r)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ remote, local string }{
		{"10.0.2.7", "100.96.2.7"},
		{"10.0.255.255", "100.96.255.255"},
		{"fd00:10:0:ab::5", "fddc:467:9000:ab::5"},
		{"172.20.1.1", "172.20.1.1"},
	}
	for _, tc := range tests {
		got, ok := l.ToLocal("b", netip.MustParseAddr(tc.remote))
		if !ok || got.String() != tc.local {
			t.Errorf("ToLocal(b, %s) = %v %v, want %s", tc.remote, got, ok, tc.local)
		}
		back, ok := l.ToRemote("b", netip.MustParseAddr(tc.local))
		if !ok || back.String() != tc.remote {
			t.Errorf("ToRemote(b, %s) = %v %v, want %s", tc.local, back, ok, tc.remote)
		}
	}
	for _, miss := range []struct{ peer, ip string }{{"b", "10.1.0.1"}, {"nobody", "10.0.0.1"}, {"b", "::ffff:10.0.0.1"}} {
		if got, ok := l.ToLocal(miss.peer, netip.MustParseAddr(miss.ip)); ok {
			t.Errorf("ToLocal(%s, %s) = %v, want no translation", miss.peer, miss.ip, got)
		}
	}
	if got, ok := l.ToRemote("b", netip.MustParseAddr("10.0.0.1")); ok {
		t.Errorf("ToRemote(b, 10.0.0.1) = %v, want none: that is my own PodCIDR", got)
	}
}

func TestToLocalDoesNotAllocate(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	if _, err := l.ViewOf("b", pfx("10.0.0.0/16")); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.0.3.4")
	if n := testing.AllocsPerRun(100, func() { l.ToLocal("b", ip) }); n != 0 {
		t.Errorf("ToLocal allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { l.ToRemote("b", netip.MustParseAddr("100.96.3.4")) }); n != 0 {
		t.Errorf("ToRemote allocates %v times", n)
	}
}

// When a range stops being ours, what peers said about how they see it is
// forgotten; claims about the ranges we keep stay.
func TestSetLocalNetworksForgetsClaimsAboutFormerRanges(t *testing.T) {
	l, _ := openTest(t, Options{})
	keep, drop := netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.0.0.0/16")
	if _, err := l.SetLocalNetworks([]LocalNetwork{{Range: drop, Kind: PodNetwork}, {Range: keep, Kind: ServiceNetwork}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"10.0.0.0/16", "100.96.0.0/16"}, {"10.96.0.0/16", "100.97.0.0/16"}} {
		if err := l.RecordTheirView("cpeer", netip.MustParsePrefix(c[0]), netip.MustParsePrefix(c[1])); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.SetLocalNetworks([]LocalNetwork{{Range: netip.MustParsePrefix("10.1.0.0/16"), Kind: PodNetwork}, {Range: keep, Kind: ServiceNetwork}}); err != nil {
		t.Fatal(err)
	}
	got := l.TheirViews("cpeer")
	if len(got) != 1 || got[0].Mine != keep {
		t.Fatalf("their views after the pod range changed: %+v, want only the claim about %s", got, keep)
	}
}
