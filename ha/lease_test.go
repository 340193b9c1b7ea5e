package ha

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// cuttable fails every request while cut: a replica partitioned from its
// API server.
type cuttable struct {
	next http.RoundTripper
	cut  atomic.Bool
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("partitioned from the API server (test)")
	}
	return c.next.RoundTrip(r)
}

// syncBuffer is a log both the test and a replica use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// candidate is one replica campaigning: when it became active, when it
// was fenced, and whether the Lease was someone else's or expired then.
type candidate struct {
	e        *Elector
	net      *cuttable
	log      *syncBuffer
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned, with err
	err      error
	active   atomic.Bool
	fenced   chan string // what the Lease said when fenced, once
	activeAt chan struct{}
	// changes are the times of its changes of state, in order.
	mu      sync.Mutex
	changes []change
}

type change struct {
	to State
	at time.Time
}

func (c *candidate) history() []change {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]change(nil), c.changes...)
}

// campaign starts a replica; with, when given, sets its timings.
func campaign(t *testing.T, cp *harness.ControlPlane, admin kubernetes.Interface, name string, others func() bool, with ...func(*Elector)) *candidate {
	t.Helper()
	c := &candidate{net: &cuttable{}, log: &syncBuffer{}, done: make(chan struct{}), fenced: make(chan string, 1), activeAt: make(chan struct{})}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.net.next = rt; return c.net }
	c.e = &Elector{
		Kube: kubernetes.NewForConfigOrDie(cfg), Namespace: namespace, Identity: NewIdentity(name),
		Log: slog.New(slog.NewTextHandler(c.log, nil)), Others: others,
	}
	for _, f := range with {
		f(c.e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		var once sync.Once
		c.err = c.e.Run(ctx, func(s State) {
			c.mu.Lock()
			c.changes = append(c.changes, change{s, time.Now()})
			c.mu.Unlock()
			c.active.Store(s == Active)
			switch s {
			case Active:
				once.Do(func() { close(c.activeAt) })
			case Fenced:
				select {
				case c.fenced <- leaseState(admin, c.e.Identity):
				default:
				}
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		c.net.cut.Store(false)
		<-c.done
	})
	return c
}

// leaseState says whether the Lease would let another replica act: held
// by another, released, or expired; "still mine" otherwise.
func leaseState(admin kubernetes.Interface, me string) string {
	l, err := admin.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName, metav1.GetOptions{})
	switch {
	case err != nil:
		return "unreadable: " + err.Error()
	case l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "":
		return "released"
	case *l.Spec.HolderIdentity != me:
		return "held by another"
	case l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
		time.Since(l.Spec.RenewTime.Time) >= time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second:
		return "expired"
	}
	return "still mine"
}

// leaseControlPlane is a control plane of the test's own with the
// agent's namespace, and its admin client.
func leaseControlPlane(t *testing.T) (*harness.ControlPlane, kubernetes.Interface) {
	t.Helper()
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	if _, err := cp.Client.CoreV1().Namespaces().Create(t.Context(), namespaceObject(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp, cp.Client
}

// fencedBeforeActive fails t unless first, once active, was fenced
// before second became active: never both active.
func fencedBeforeActive(t *testing.T, first, second *candidate) {
	t.Helper()
	h1, h2 := first.history(), second.history()
	if len(h1) != 2 || h1[1].to != Fenced || len(h2) != 1 || !h1[1].at.Before(h2[0].at) {
		t.Fatalf("the partitioned replica went %v, the standby %v: want the first fenced before the second active", h1, h2)
	}
	t.Logf("fenced %.2fs before the standby became active", h2[0].at.Sub(h1[1].at).Seconds())
}

func waitActive(t *testing.T, c *candidate, what string) {
	t.Helper()
	select {
	case <-c.activeAt:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not become active; its log:\n%s", what, c.log)
	}
}

// One replica at a time is active. One partitioned from the API server
// keeps its role until the other holds the Lease or the Lease expired,
// then is fenced; one stopped releases the Lease, and the other takes
// over at once.
func TestLease(t *testing.T) {
	cp, admin := leaseControlPlane(t)

	first := campaign(t, cp, admin, "gw1", nil)
	waitActive(t, first, "the first replica")
	second := campaign(t, cp, admin, "gw2", nil)
	// The witness: the second replica read the Lease and saw the first.
	eventually.Within(t, 30*time.Second, "the standby saw the active replica", func() error {
		if !strings.Contains(second.log.String(), "active replica") || !strings.Contains(second.log.String(), first.e.Identity) {
			return fmt.Errorf("standby's log:\n%s", second.log)
		}
		return nil
	})
	if second.active.Load() {
		t.Fatal("two replicas active at once")
	}
	if a, _ := second.e.Active(); a {
		t.Fatal("the standby says it is active")
	}

	t.Run("partitioned active is fenced once the standby may act", func(t *testing.T) {
		cut := time.Now()
		first.net.cut.Store(true)
		waitActive(t, second, "the standby")
		t.Logf("the standby active %.2fs after the active was partitioned from the API server", time.Since(cut).Seconds())
		select {
		case got := <-first.fenced:
			if got == "held by another" {
				t.Fatalf("the partitioned replica was fenced once the Lease was another's, not before")
			}
			t.Logf("fenced when the Lease was %s", got)
		case <-time.After(60 * time.Second):
			t.Fatalf("the partitioned replica was not fenced; its log:\n%s", first.log)
		}
		// Never both active: the first was fenced before the second
		// became active.
		fencedBeforeActive(t, first, second)
		if a, _ := first.e.Active(); a {
			t.Fatal("the fenced replica says it is active")
		}
		// Healed, it reads the Lease, sees the other holder and returns.
		first.net.cut.Store(false)
		select {
		case <-first.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("the fenced replica did not return once it could read the Lease; its log:\n%s", first.log)
		}
		if first.err != nil {
			t.Fatal(first.err)
		}
		if !strings.Contains(first.log.String(), "another replica holds the Lease") {
			t.Errorf("no log line saying another replica holds the Lease:\n%s", first.log)
		}
	})

	t.Run("a stopped active releases the Lease", func(t *testing.T) {
		third := campaign(t, cp, admin, "gw3", nil)
		eventually.Within(t, 30*time.Second, "the new standby saw the active replica", func() error {
			if !strings.Contains(third.log.String(), second.e.Identity) {
				return fmt.Errorf("standby's log:\n%s", third.log)
			}
			return nil
		})
		stop := time.Now()
		second.cancel()
		defer func() { t.Logf("the standby active %.2fs after the active stopped", time.Since(stop).Seconds()) }()
		// Fenced before it released the Lease: never both active.
		if got := <-second.fenced; got != "still mine" {
			t.Fatalf("the stopped replica was fenced with the Lease %s, want still its own (released after)", got)
		}
		waitActive(t, third, "the standby after a release")
	})
}

// An active replica that cannot renew the Lease keeps its role while no
// other replica could take it, however long; one that could be replaced
// is fenced, and is active again once it renews a Lease nobody took.
func TestLeaseUnrenewed(t *testing.T) {
	cp, admin := leaseControlPlane(t)
	// The witness that the replica went past the point where it would
	// have been fenced: the line it logs there.
	pastFence := "no other replica could take it: the data path stays up"

	t.Run("alone", func(t *testing.T) {
		c := campaign(t, cp, admin, "gw1", func() bool { return false })
		waitActive(t, c, "the replica")
		c.net.cut.Store(true)
		eventually.Within(t, 60*time.Second, "the replica went past its fence", func() error {
			if !strings.Contains(c.log.String(), pastFence) {
				return fmt.Errorf("its log:\n%s", c.log)
			}
			return nil
		})
		if h := c.history(); len(h) != 1 || !c.active.Load() {
			t.Fatalf("a replica alone went %v past its fence, want active all along", h)
		}
		c.net.cut.Store(false)
		eventually.Within(t, 60*time.Second, "the replica renews again", func() error {
			if !strings.Contains(c.log.String(), "the Lease is renewed again") {
				return fmt.Errorf("its log:\n%s", c.log)
			}
			return nil
		})
		if h := c.history(); len(h) != 1 {
			t.Fatalf("a replica alone went %v, want active all along", h)
		}
		c.cancel()
		<-c.done
	})

	t.Run("renewals missed for less than a lease duration change nothing", func(t *testing.T) {
		c := campaign(t, cp, admin, "gw3", func() bool { return true })
		waitActive(t, c, "the replica")
		c.net.cut.Store(true)
		eventually.Within(t, 60*time.Second, "a renewal failed", func() error {
			if !strings.Contains(c.log.String(), "the Lease was not renewed;") {
				return fmt.Errorf("its log:\n%s", c.log)
			}
			return nil
		})
		c.net.cut.Store(false)
		eventually.Within(t, 60*time.Second, "the replica renews again", func() error {
			if !strings.Contains(c.log.String(), "the Lease is renewed again") {
				return fmt.Errorf("its log:\n%s", c.log)
			}
			return nil
		})
		if h := c.history(); len(h) != 1 || !c.active.Load() {
			t.Fatalf("after renewals missed briefly the replica went %v, want active all along", h)
		}
		c.cancel()
		<-c.done
	})

	t.Run("fenced, then the Lease is its own again", func(t *testing.T) {
		c := campaign(t, cp, admin, "gw2", func() bool { return true })
		waitActive(t, c, "the replica")
		c.net.cut.Store(true)
		select {
		case got := <-c.fenced:
			t.Logf("fenced when the Lease was %s", got)
		case <-time.After(60 * time.Second):
			t.Fatalf("the partitioned replica was not fenced; its log:\n%s", c.log)
		}
		c.net.cut.Store(false)
		eventually.Within(t, 60*time.Second, "the replica active again", func() error {
			if h := c.history(); len(h) != 3 || h[2].to != Active {
				return fmt.Errorf("it went %v, want active, fenced, active", h)
			}
			return nil
		})
		select {
		case <-c.done:
			t.Fatalf("Run returned with the Lease its own: %v", c.err)
		default:
		}
		if state := leaseState(admin, c.e.Identity); state != "still mine" {
			t.Fatalf("the Lease is %s, want still the replica's", state)
		}
	})
}

// A standby takes a released Lease as soon as it is released, not at its
// next retry: with a retry period longer than the test may last, it
// becomes active once the active one stops.
func TestLeaseReleasedTakenAtOnce(t *testing.T) {
	cp, admin := leaseControlPlane(t)
	first := campaign(t, cp, admin, "gw1", nil)
	waitActive(t, first, "the first replica")

	const retry = 5 * time.Minute
	slow := func(e *Elector) {
		e.LeaseDuration, e.RenewDeadline, e.RetryPeriod = 20*time.Minute, 10*time.Minute, retry
	}
	// Its first try is at once; the next no earlier than a retry period
	// after it.
	tried := time.Now()
	second := campaign(t, cp, admin, "gw2", nil, slow)
	// The witness: its first try read the Lease held by the first.
	eventually.Within(t, 60*time.Second, "the standby saw the active replica", func() error {
		if !strings.Contains(second.log.String(), first.e.Identity) {
			return fmt.Errorf("standby's log:\n%s", second.log)
		}
		return nil
	})
	if second.active.Load() {
		t.Fatal("two replicas active at once")
	}

	stop := time.Now()
	first.cancel()
	<-first.done
	select {
	case <-second.activeAt:
	case <-time.After(time.Until(tried.Add(retry))):
		t.Fatalf("the standby did not take the released Lease before its next retry; its log:\n%s", second.log)
	}
	t.Logf("the standby active %.3fs after the active was told to stop", time.Since(stop).Seconds())
	if state := leaseState(admin, second.e.Identity); state != "still mine" {
		t.Fatalf("the Lease is %s, want the standby's", state)
	}
	if !strings.Contains(second.log.String(), "the Lease was released: trying to take it now") {
		t.Errorf("no log line saying the standby saw the release:\n%s", second.log)
	}
}

// A standby takes a Lease its holder stopped renewing once its watch saw
// no renewal for a lease duration, not at a later try of client-go's
// election; the old holder, cut from the API server, was fenced before.
func TestLeaseExpiredTakenFromTheWatch(t *testing.T) {
	cp, admin := leaseControlPlane(t)
	first := campaign(t, cp, admin, "gw1", nil)
	waitActive(t, first, "the first replica")
	// The slowest tries client-go allows with the default lease duration
	// and renew deadline: its own takeover would come up to 4.4 s after
	// the watch's.
	slow := func(e *Elector) { e.RetryPeriod = 2 * time.Second }
	second := campaign(t, cp, admin, "gw2", nil, slow)
	eventually.Within(t, 60*time.Second, "the standby saw the active replica", func() error {
		if !strings.Contains(second.log.String(), first.e.Identity) {
			return fmt.Errorf("standby's log:\n%s", second.log)
		}
		return nil
	})

	cut := time.Now()
	first.net.cut.Store(true)
	waitActive(t, second, "the standby")
	t.Logf("the standby active %.2fs after the active was cut from the API server", time.Since(cut).Seconds())
	if !strings.Contains(second.log.String(), "the Lease was not renewed for a lease duration: took it") {
		t.Errorf("the standby did not take the Lease from its watch; its log:\n%s", second.log)
	}
	select {
	case <-first.fenced:
	case <-time.After(60 * time.Second):
		t.Fatalf("the partitioned replica was not fenced; its log:\n%s", first.log)
	}
	fencedBeforeActive(t, first, second)
	if state := leaseState(admin, second.e.Identity); state != "still mine" {
		t.Fatalf("the Lease is %s, want the standby's", state)
	}
}

// silenceable is a replica's heartbeat socket, which sends nothing while
// cut: a replica whose node died, with cuttable.
type silenceable struct {
	net.PacketConn
	cut atomic.Bool
}

func (s *silenceable) WriteTo(b []byte, to net.Addr) (int, error) {
	if s.cut.Load() {
		return len(b), nil
	}
	return s.PacketConn.WriteTo(b, to)
}

// beating gives two replicas about to campaign a heartbeat each on the
// loopback, each pinging the other, and returns them to pass to campaign
// with their sockets, to silence.
func beating(t *testing.T, timings ...func(*Elector)) (first, second func(*Elector), firstConn, secondConn *silenceable) {
	t.Helper()
	listen := func() (*silenceable, netip.AddrPort) {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &silenceable{PacketConn: c}, c.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	c1, a1 := listen()
	c2, a2 := listen()
	with := func(c *silenceable, other netip.AddrPort) func(*Elector) {
		return func(e *Elector) {
			for _, f := range timings {
				f(e)
			}
			e.Heartbeat = &Heartbeat{Conn: c, Peers: func() []netip.AddrPort { return []netip.AddrPort{other} }}
		}
	}
	return with(c1, a2), with(c2, a1), c1, c2
}

// heardBothWays waits until the standby c may take early from the
// active replica: a ping acknowledged one of its answers.
func heardBothWays(t *testing.T, c *candidate) {
	t.Helper()
	eventually.Within(t, 60*time.Second, "the standby's heartbeat works both ways", func() error {
		h := c.e.Heartbeat
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.heard.acked {
			return fmt.Errorf("heard %+v from %q", h.heard, h.holder)
		}
		return nil
	})
}

// A standby takes over from an active replica that died (cut from the API
// server and silent) once it heard no ping for a second and saw no
// renewal for 1.5 s, long before the Lease (20 s here) expires; the dead
// replica, had it lived on, was fenced before.
func TestHeartbeatTakesOverFromTheDead(t *testing.T) {
	cp, admin := leaseControlPlane(t)
	long := func(e *Elector) { e.LeaseDuration = 20 * time.Second }
	w1, w2, conn1, _ := beating(t, long)
	first := campaign(t, cp, admin, "gw1", nil, w1)
	waitActive(t, first, "the first replica")
	second := campaign(t, cp, admin, "gw2", nil, w2)
	heardBothWays(t, second)

	died := time.Now()
	first.net.cut.Store(true)
	conn1.cut.Store(true)
	waitActive(t, second, "the standby")
	t.Logf("the standby active %.2fs after the active died", time.Since(died).Seconds())
	if !strings.Contains(second.log.String(), "the active replica went silent and the Lease was not renewed: took it") {
		t.Fatalf("the standby did not take the Lease for the silence; its log:\n%s", second.log)
	}
	select {
	case <-first.fenced:
	case <-time.After(60 * time.Second):
		t.Fatalf("the dead replica, still running, was not fenced; its log:\n%s", first.log)
	}
	fencedBeforeActive(t, first, second)
	if state := leaseState(admin, second.e.Identity); state != "still mine" {
		t.Fatalf("the Lease is %s, want the standby's", state)
	}
}

// Heartbeats alone move nothing. An active replica that is cut from the
// API server but still pings is replaced only once the Lease expired (a
// partition, not a death); one whose pings are lost but that renews stays
// active.
func TestHeartbeatAloneMovesNothing(t *testing.T) {
	cp, admin := leaseControlPlane(t)

	t.Run("pings lost, renewals go on", func(t *testing.T) {
		w1, w2, conn1, _ := beating(t)
		first := campaign(t, cp, admin, "gw1", nil, w1)
		waitActive(t, first, "the first replica")
		second := campaign(t, cp, admin, "gw2", nil, w2)
		heardBothWays(t, second)
		conn1.cut.Store(true)
		// The witness: the standby has heard nothing for longer than it
		// waits before it takes early, and has seen renewals since.
		_, silence, unrenewed := second.e.Heartbeat.timings()
		eventually.Within(t, 60*time.Second, "the standby silent past its wait, seeing renewals", func() error {
			h := second.e.Heartbeat
			h.mu.Lock()
			defer h.mu.Unlock()
			if quiet := time.Since(h.heard.lastPing); quiet < 2*(silence+unrenewed) || !h.changed.After(h.heard.lastPing.Add(silence+unrenewed)) {
				return fmt.Errorf("quiet for %s, Lease last changed %s after the last ping", quiet, h.changed.Sub(h.heard.lastPing))
			}
			return nil
		})
		if second.active.Load() || len(first.history()) != 1 {
			t.Fatalf("pings lost: the active went %v, the standby %v; want nothing moved", first.history(), second.history())
		}
		first.cancel()
		<-first.done
		waitActive(t, second, "the standby once the active stopped")
		second.cancel()
		<-second.done
	})

	t.Run("cut from the API server, pinging", func(t *testing.T) {
		w1, w2, _, _ := beating(t)
		first := campaign(t, cp, admin, "gw3", nil, w1)
		waitActive(t, first, "the first replica")
		second := campaign(t, cp, admin, "gw4", nil, w2)
		heardBothWays(t, second)
		first.net.cut.Store(true)
		waitActive(t, second, "the standby")
		if log := second.log.String(); !strings.Contains(log, "the Lease was not renewed for a lease duration: took it") || strings.Contains(log, "went silent") {
			t.Fatalf("the standby of a replica still pinging took the Lease other than once it expired; its log:\n%s", log)
		}
		fencedBeforeActive(t, first, second)
	})
}

// A standby that died shortens the active replica's fence only for a
// while: once it has not answered for a silence, the active replica only
// probes it, and once its window has surely closed the fence is a lease
// duration after the last renewal again.
func TestHeartbeatDeadStandbyStopsCounting(t *testing.T) {
	cp, admin := leaseControlPlane(t)
	w1, w2, _, conn2 := beating(t)
	first := campaign(t, cp, admin, "gw1", nil, w1)
	waitActive(t, first, "the first replica")
	second := campaign(t, cp, admin, "gw2", nil, w2)
	heardBothWays(t, second)
	leaseDuration, _, retry := first.e.timings()
	first.e.mu.Lock()
	lock := first.e.lock
	first.e.mu.Unlock()
	fenceAfter := func() time.Duration {
		h, _ := lock.state()
		return h.fenceAt(time.Now()).Sub(h.renewed)
	}
	full := leaseDuration - fenceMargin(retry)
	if d := fenceAfter(); d >= full {
		t.Fatalf("with a standby answering, the fence comes %s after a renewal, want sooner than %s", d, full)
	}
	second.net.cut.Store(true)
	conn2.cut.Store(true)
	eventually.Within(t, 60*time.Second, "the active replica's fence a lease duration after its renewal again", func() error {
		if d := fenceAfter(); d != full {
			return fmt.Errorf("the fence comes %s after a renewal, want %s", d, full)
		}
		return nil
	})
	if h := first.history(); len(h) != 1 || !first.active.Load() {
		t.Fatalf("the active replica went %v, want active all along", h)
	}
}
