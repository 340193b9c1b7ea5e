package discovery

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// Members that join a seed together learn of each other from the seed's
// push once joins to it go quiet, not from their own follow-ups: gossip,
// probes and periodic exchanges are off and the joiners' follow-ups are a
// minute away, so the push is the only way they meet; it also makes
// their follow-ups needless.
func TestJoinersLearnOfEachOtherFromTheSeedsPush(t *testing.T) {
	quiet := func(c *memberlist.Config) { c.GossipInterval, c.ProbeInterval, c.PushPullInterval = 0, 0, 0 }
	s := startNode(t, nodeOpts{tune: quiet})
	t.Cleanup(s.d.kill) // a Leave would wait for gossip that is off
	var joiners []*testNode
	for range 3 {
		n := startNode(t, nodeOpts{seeds: []string{s.addr()}, tune: quiet, settle: time.Minute})
		t.Cleanup(n.d.kill)
		joiners = append(joiners, n)
	}
	waitUntil(t, 10*time.Second, func() error {
		var errs []error
		for i, n := range joiners {
			errs = append(errs, sees(n, slices.Delete(slices.Clone(joiners), i, i+1)...))
		}
		return errors.Join(errs...)
	})
	if n := metricValue(t, s.reg, "flotilla_discovery_join_pushes_total"); n < float64(len(joiners)) {
		t.Errorf("the seed pushed %v times, want at least once to each of the %d joiners", n, len(joiners))
	}
	for _, n := range joiners {
		if j := metricValue(t, n.reg, "flotilla_discovery_joins_total"); j != 1 {
			t.Errorf("%s made %v exchanges with the seed, want its join alone", n.id.ClusterID(), j)
		}
		n.d.cands.mu.Lock()
		resync := n.d.cands.table[s.addr()].resync
		n.d.cands.mu.Unlock()
		if resync {
			t.Errorf("%s: a follow-up with the seed is still pending after its push", n.id.ClusterID())
		}
	}
}

// Only a member's joins count: an exchange it started (its own join, a
// push) and the follow-ups and pushes of others do not, so no push brings
// on another. A push waits for joins to go quiet, or for pushWait after
// the first of a stream, and reaches those that joined within the settle
// time.
func TestJoinPushBookkeeping(t *testing.T) {
	p := newJoinPush(time.Second)
	t0 := time.Unix(1000, 0)
	if k := p.kind(); k != exchangeJoin {
		t.Fatalf("kind at rest %q, want a join's", k)
	}
	done := p.dial("192.0.2.1:7946", exchangePush)
	if k := p.kind(); k != exchangePush {
		t.Errorf("kind while pushing %q, want a push's", k)
	}
	p.sawJoin("cseed", "192.0.2.1:7946", t0)
	if !p.due().IsZero() {
		t.Errorf("the answer to our own push counted as a join")
	}
	done()
	follow := p.dial("192.0.2.9:7946", exchangeFollow)
	if k := p.kind(); k != exchangeFollow {
		t.Errorf("kind while following up %q, want a follow-up's", k)
	}
	follow()

	p.sawJoin("ca", "192.0.2.2:7946", t0)
	if got, want := p.due(), t0.Add(p.quiet); !got.Equal(want) {
		t.Errorf("one join: push due %v, want %v", got, want)
	}
	// Joins every 100 ms: the push waits for quiet, at most pushWait.
	for i := 1; i <= 8; i++ {
		p.sawJoin(fmt.Sprintf("c%d", i), fmt.Sprintf("192.0.2.%d:7946", 10+i), t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got, want := p.due(), t0.Add(p.wait); !got.Equal(want) {
		t.Errorf("a stream of joins: push due %v, want %v (pushWait after the first)", got, want)
	}
	got := p.take(t0.Add(1050 * time.Millisecond))
	slices.Sort(got)
	want := []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"} // ca joined 1.05 s before
	if !slices.Equal(got, want) {
		t.Errorf("pushed to %v, want %v", got, want)
	}
	if !p.due().IsZero() {
		t.Errorf("a push is due again with no join since")
	}
}

func TestExchangeState(t *testing.T) {
	id := mustIdentity(t).ClusterID()
	for _, kind := range []byte{exchangeJoin, exchangeFollow, exchangePush} {
		k, got, err := decodeExchange(encodeExchange(kind, id))
		if err != nil || k != kind || got != id {
			t.Errorf("kind %q: decoded %q %q %v", kind, k, got, err)
		}
	}
	for name, buf := range map[string][]byte{
		"empty":        nil,
		"kind alone":   {exchangeJoin},
		"unknown kind": encodeExchange('x', id),
		"not an ID":    encodeExchange(exchangeJoin, "192.0.2.1:7946"),
	} {
		if _, _, err := decodeExchange(buf); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// What a member sends in a state exchange is another cluster's writing:
// it decodes or is refused, and what decodes encodes back to the same
// bytes.
func FuzzDecodeExchange(f *testing.F) {
	f.Add(encodeExchange(exchangeJoin, "caaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"))
	f.Add([]byte{exchangePush})
	f.Add([]byte("p\x00\xff"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		kind, id, err := decodeExchange(buf)
		if err != nil {
			return
		}
		if again := encodeExchange(kind, id); !bytes.Equal(again, buf) {
			t.Fatalf("decoded %q %q from %q, which encodes to %q", kind, id, buf, again)
		}
	})
}
