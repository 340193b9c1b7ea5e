package ipam

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// randomRange returns a range likely to collide: inside 10.0.0.0/8, inside
// the pool, or an IPv6 ULA range.
func randomRange(r *rand.Rand) netip.Prefix {
	switch r.IntN(3) {
	case 0:
		a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
		return netip.PrefixFrom(a, 14+r.IntN(13)).Masked()
	case 1:
		a := netip.AddrFrom4([4]byte{100, 96 + byte(r.IntN(4)), byte(r.IntN(256)), 0})
		return netip.PrefixFrom(a, 16+r.IntN(9)).Masked()
	default:
		a := netip.AddrFrom16([16]byte{0xfd, 0, 0, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
		return netip.PrefixFrom(a, 40+r.IntN(25)).Masked()
	}
}

func TestPropertyViewsNeverOverlap(t *testing.T) {
	steps := 4000
	if testing.Short() {
		steps = 500
	}
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 1))
	opts := Options{
		Pools:      []netip.Prefix{pfx("100.96.0.0/14"), pfx("fddc:467:9000::/44")},
		Quarantine: 30 * time.Second,
		noSync:     true,
	}
	l, clk := openTest(t, opts)
	opts.Now = clk.Now
	setLocals(t, l, []LocalNetwork{
		{Range: pfx("10.0.0.0/16"), Kind: PodNetwork},
		{Range: pfx("10.1.0.0/16"), Kind: ServiceNetwork},
		{Range: pfx("fd00:0:0:1::/64"), Kind: PodNetwork},
	})
	peer := func() string { return fmt.Sprintf("c%02d", r.IntN(40)) }
	allowed := func(err error) bool {
		return err == nil || errors.Is(err, ErrExhausted) || errors.Is(err, ErrInvalidRange) || errors.Is(err, ErrNotFound)
	}
	for step := 0; step < steps; step++ {
		var op string
		var err error
		switch n := r.IntN(100); {
		case n < 60:
			p, rg := peer(), randomRange(r)
			op = fmt.Sprintf("ViewOf(%s, %s)", p, rg)
			var v netip.Prefix
			if v, err = l.ViewOf(p, rg); err == nil {
				if again, err2 := l.ViewOf(p, rg); err2 != nil || again != v {
					t.Fatalf("step %d: %s not idempotent: %v then %v %v", step, op, v, again, err2)
				}
			}
		case n < 75:
			vs := l.Views("")
			if len(vs) == 0 {
				continue
			}
			v := vs[r.IntN(len(vs))]
			op = fmt.Sprintf("Release(%s, %s)", v.Peer, v.Remote)
			err = l.Release(v.Peer, v.Remote)
		case n < 80:
			p := peer()
			op = fmt.Sprintf("ReleasePeer(%s)", p)
			err = l.ReleasePeer(p)
		case n < 88:
			p := peer()
			rs := []netip.Prefix{randomRange(r), randomRange(r)}
			if vs := l.Views(""); len(vs) > 0 && r.IntN(2) == 0 {
				// The peer re-aggregates a range: splits it or merges it
				// with its sibling (views inherit their addresses).
				v := vs[r.IntN(len(vs))]
				p, rs = v.Peer, []netip.Prefix{netip.PrefixFrom(v.Remote.Addr(), v.Remote.Bits()-1).Masked()}
				if v.Remote.Bits() < v.Remote.Addr().BitLen() && r.IntN(2) == 0 {
					lo := netip.PrefixFrom(v.Remote.Addr(), v.Remote.Bits()+1)
					rs = []netip.Prefix{lo, outside(v.Remote, lo)[0]}
				}
			}
			op = fmt.Sprintf("SyncPeer(%s, %v)", p, rs)
			_, err = l.SyncPeer(p, rs)
		case n < 95:
			var reqs []ViewRequest
			for i := 0; i < 5; i++ {
				reqs = append(reqs, ViewRequest{peer(), randomRange(r)})
			}
			op = fmt.Sprintf("ViewsOf(%v)", reqs)
			_, err = l.ViewsOf(reqs)
		case n < 98:
			op = "advance clock"
			clk.Advance(time.Duration(r.IntN(20)) * time.Second)
		case n < 99:
			op = "reopen"
			l = reopen(t, l, opts)
		default:
			extra := LocalNetwork{Range: randomRange(r), Kind: ReservedNetwork}
			op = fmt.Sprintf("add local %s and remap conflicts", extra.Range)
			nets := l.LocalNetworks()
			if slices.ContainsFunc(nets, func(n LocalNetwork) bool { return n.Range == extra.Range }) {
				continue
			}
			var conflicts []Conflict
			if conflicts, err = l.SetLocalNetworks(append(nets, extra)); err == nil {
				for _, c := range conflicts {
					if _, err := l.Remap(c.View.Peer, c.View.Remote); err != nil && !errors.Is(err, ErrNotFound) {
						// Exhausted: drop the view the way the agent would.
						if err := l.Release(c.View.Peer, c.View.Remote); err != nil && !errors.Is(err, ErrNotFound) {
							t.Fatalf("step %d: release conflict: %v", step, err)
						}
					}
				}
			}
		}
		if !allowed(err) {
			t.Fatalf("step %d: %s: unexpected error %v", step, op, err)
		}
		if err := checkInvariants(l); err != nil {
			t.Fatalf("step %d: after %s: %v", step, op, err)
		}
	}
	t.Logf("%d views, %d quarantined at the end", len(l.Views("")), len(l.Quarantine()))
}
