package tunnel_test

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
)

// wgPeerState is one peer line of `wg show IF dump`.
type wgPeerState struct {
	handshake bool
	rx, tx    int64
	keepalive string // "off" or seconds
}

func (s *meshSite) wgPeer(t testing.TB, o *meshSite) (wgPeerState, bool) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(s.exec(t, "wg", "show", s.ifname, "dump")), "\n")[1:] {
		f := strings.Split(line, "\t")
		if len(f) != 8 || f[0] != o.pub.String() {
			continue
		}
		rx, _ := strconv.ParseInt(f[5], 10, 64)
		tx, _ := strconv.ParseInt(f[6], 10, 64)
		return wgPeerState{handshake: f[4] != "0", rx: rx, tx: tx, keepalive: f[7]}, true
	}
	return wgPeerState{}, false
}

// keepalive is desiredFor with a persistent keepalive on every peer, as
// the agent configures them.
func keepalive(m *mesh, s *meshSite, peers ...*meshSite) tunnel.Desired {
	d := m.desiredFor(s, peers...)
	for i := range d.Peers {
		d.Peers[i].Keepalive = 25 * time.Second
	}
	return d
}

// firstContactPair starts two sites' tunnels with no peers, the one that
// waits on first contact (w) with the given -first-contact-wait.
func firstContactPair(t *testing.T, wait string) (m *mesh, w, x *meshSite) {
	t.Helper()
	m = newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	w, x = waiterAndInitiator(m.sites[0], m.sites[1])
	m.start(w, "-first-contact-wait", wait)
	m.start(x)
	for _, s := range []*meshSite{w, x} {
		m.apply(s, m.desiredFor(s))
		s.waitListening(t)
	}
	return m, w, x
}

func pingBothWays(t *testing.T, a, b *meshSite) {
	t.Helper()
	for _, pair := range [][2]*meshSite{{a, b}, {b, a}} {
		if err := pair[0].pod.Ping(pair[0].seenFrom(pair[1])); err != nil {
			t.Errorf("%s -> %s: %v", pair[0].name, pair[1].name, err)
		}
	}
}

// waiterAndInitiator orders two sites: the first has the larger public
// key and so leaves a first contact to the second.
func waiterAndInitiator(a, b *meshSite) (*meshSite, *meshSite) {
	if bytes.Compare(a.pub[:], b.pub[:]) > 0 {
		return a, b
	}
	return b, a
}

// Of two new peers only one initiates: the side with the larger key adds
// the peer without its keepalive and sends nothing until the other side's
// handshake arrives; then it turns the keepalive on and traffic flows both
// ways. The witness that the waiting side's device has taken the new
// peers and would have sent an initiation by now: in the same apply it
// initiates to a third site, whose key is larger than its own.
func TestFirstContactOneSideInitiates(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16", "10.0.0.0/16")
	sites := slices.Clone(m.sites)
	slices.SortFunc(sites, func(a, b *meshSite) int { return bytes.Compare(a.pub[:], b.pub[:]) })
	x, w, y := sites[0], sites[1], sites[2] // w waits for x; y waits for w
	m.start(w, "-first-contact-wait", "1h")
	m.start(x)
	m.start(y, "-first-contact-wait", "1h")
	for _, s := range sites {
		m.apply(s, m.desiredFor(s))
		s.waitListening(t)
	}
	m.apply(w, keepalive(m, w, x, y))
	waitUntil(t, 10*time.Second, "the waiting side initiating to the site with the larger key", func() bool {
		st, _ := w.wgPeer(t, y)
		return st.tx > 0
	})
	st, ok := w.wgPeer(t, x)
	if !ok || st.keepalive != "off" || st.tx != 0 {
		t.Fatalf("waiting side before the other initiated: %+v (found %v), want keepalive off and nothing sent", st, ok)
	}
	m.apply(x, keepalive(m, x, w))
	waitUntil(t, 10*time.Second, "handshake on both sides and the waiting side's keepalive on", func() bool {
		ws, _ := w.wgPeer(t, x)
		xs, _ := x.wgPeer(t, w)
		return ws.handshake && xs.handshake && ws.keepalive == "25"
	})
	if st, _ := x.wgPeer(t, w); st.keepalive != "25" {
		t.Errorf("initiating side's keepalive: %s, want 25", st.keepalive)
	}
	pingBothWays(t, w, x)
}

// When nothing comes from the peer within the wait (its initiation went
// out before this side knew it), the waiting side initiates itself.
func TestFirstContactInitiatesWhenNothingComes(t *testing.T) {
	m, w, x := firstContactPair(t, "200ms")
	m.apply(w, keepalive(m, w, x))
	waitUntil(t, 10*time.Second, "the waiting side initiating", func() bool {
		st, _ := w.wgPeer(t, x)
		return st.keepalive == "25" && st.tx > 0
	})
	if st, _ := w.wgPeer(t, x); st.handshake {
		t.Fatalf("handshake with a peer that does not know us: %+v", st)
	}
	m.apply(x, keepalive(m, x, w))
	pingBothWays(t, w, x)
}

// withFirstContact sets what the peer of site o says in d.
func withFirstContact(d tunnel.Desired, o *meshSite, says tunnel.FirstContact) tunnel.Desired {
	for i := range d.Peers {
		if d.Peers[i].PublicKey == o.pub {
			d.Peers[i].FirstContact = says
		}
	}
	return d
}

// A peer that says its data path holds us has initiated already: when
// nothing came from it, its initiation came before this side knew it and
// was dropped, so the waiting side initiates at once, not after a guess.
// The peer here holds nobody, so anything the waiting side sends is its
// own initiation.
func TestFirstContactInitiatesWhenThePeerIsReady(t *testing.T) {
	m, w, x := firstContactPair(t, "1h")
	m.apply(w, withFirstContact(keepalive(m, w, x), x, tunnel.FirstContactReady))
	waitUntil(t, 10*time.Second, "the waiting side initiating", func() bool {
		st, _ := w.wgPeer(t, x)
		return st.keepalive == "25" && st.tx > 0
	})
	m.apply(x, keepalive(m, x, w))
	pingBothWays(t, w, x)
}

// A peer that says when its data path holds us is not guessed about: the
// waiting side sends nothing until the peer says so, however long that
// takes (a guess made both sides initiate when the peer was slow, under
// load). The witness that the guess would have fired: in the same apply,
// the waiting side initiates to a peer that says nothing, after the guess.
func TestFirstContactWaitsUntilThePeerIsReady(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16", "10.0.0.0/16")
	sites := slices.Clone(m.sites)
	slices.SortFunc(sites, func(a, b *meshSite) int { return bytes.Compare(a.pub[:], b.pub[:]) })
	x, z, w := sites[0], sites[1], sites[2] // w waits for both
	m.start(w, "-first-contact-wait", "200ms")
	m.start(x)
	m.start(z)
	for _, s := range sites {
		m.apply(s, m.desiredFor(s))
		s.waitListening(t)
	}
	d := withFirstContact(keepalive(m, w, x, z), x, tunnel.FirstContactAnnounced)
	m.apply(w, d)
	waitUntil(t, 10*time.Second, "the guess about the peer that says nothing", func() bool {
		st, _ := w.wgPeer(t, z)
		return st.tx > 0
	})
	if st, ok := w.wgPeer(t, x); !ok || st.keepalive != "off" || st.tx != 0 {
		t.Fatalf("waiting side before the peer said it holds us: %+v (found %v), want keepalive off and nothing sent", st, ok)
	}
	m.apply(x, keepalive(m, x, w))
	m.apply(w, withFirstContact(d, x, tunnel.FirstContactReady))
	waitUntil(t, 10*time.Second, "handshake on both sides and the waiting side's keepalive on", func() bool {
		ws, _ := w.wgPeer(t, x)
		xs, _ := x.wgPeer(t, w)
		return ws.handshake && xs.handshake && ws.keepalive == "25"
	})
	pingBothWays(t, w, x)
}
