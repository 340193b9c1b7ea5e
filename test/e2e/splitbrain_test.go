package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vishvananda/netlink"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Cluster a's agent runs with --leader-elect, its replicas as processes
// on gateway sites of their own, and peers with b. Its active replica is
// cut off from a's API server (its packets to it dropped in its site),
// not from anything else.
//
// Alone (one agent pod), the active replica keeps its data path past the
// instant another could have taken the Lease: its WireGuard link and
// routes stay, and b's pod still reaches a's through them.
//
// Once another replica could take the Lease, the first is fenced: its
// link goes; when it reaches the API server again and nobody took the
// Lease, its data path comes back, without a restart, and b reaches a.
//
// With a second replica running, the first removes its data path
// before the second brings up its own: both replicas' links, sampled
// every 10 ms from the cut until the first has stopped, are never up at
// once. Meanwhile b's pod reaches a's pod behind the second replica: the
// peers follow the new active one while the old still runs. Once it
// reaches the API server again, the first sees the Lease another's and
// stops.
func TestSplitBrainLeavesOneDataPath(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3[:2], LAN: lan,
		ArgsFor: func(i int, _ []*federation.Cluster) []string {
			if i != 0 {
				return nil
			}
			return []string{"--leader-elect", "--namespace", federation.AgentNamespace, "--node-name", "a1", "--pod-name", "agent-a1"}
		}})
	a, b := cs[0], cs[1]
	agentPod(t, a, "agent-a1")
	federation.Connect(t, cs)
	first := replica{name: "a1", site: a.Site, iface: a.Interface(), proc: a.Agent}

	t.Run("alone, it keeps forwarding", func(t *testing.T) {
		cut := cutFromAPIServer(t, a.CP, first.site)
		waitLog(t, first.proc, "no other replica could take it: the data path stays up")
		if up, err := first.linkUp(first.handle(t)); err != nil || !up {
			t.Fatalf("the link of the replica alone: up %v, %v; want up", up, err)
		}
		if routes := first.routes(t); routes == "" {
			t.Fatal("no routes through the link of the replica alone")
		}
		if r := federation.Exchange(t, b, a); r.Err != nil {
			t.Fatalf("b to a while a's agent is cut off from its API server: %v", r.Err)
		}
		cut.heal(t)
		waitLog(t, first.proc, "the Lease is renewed again")
		if strings.Contains(first.proc.Log(), "removing the data path") {
			t.Fatalf("the replica alone removed its data path:\n%s", first.proc.Tail(30))
		}
	})

	// From here on, a second agent pod exists: the first could be
	// replaced, and is fenced when it cannot renew.
	agentPod(t, a, "agent-a2")
	// The witness that the first counts it (its informer, or its own
	// lists while the informer's watch, broken by the cut above, is
	// retried after a backoff).
	waitLog(t, first.proc, "others=agent-a2")

	t.Run("fenced, it forwards again once the Lease is still its own", func(t *testing.T) {
		cut := cutFromAPIServer(t, a.CP, first.site)
		waitLog(t, first.proc, "removing the data path")
		eventually.Within(t, 30*time.Second, "the fenced replica's link gone", func() error {
			if up, err := first.linkUp(first.handle(t)); err != nil || up {
				return fmt.Errorf("up %v, %v", up, err)
			}
			return nil
		})
		cut.heal(t)
		waitLog(t, first.proc, "bringing the data path back")
		eventually.Within(t, 60*time.Second, "b reaches a again", func() error {
			return federation.Exchange(t, b, a).Err
		})
		if exited, _ := first.proc.Exited(); exited {
			t.Fatalf("the replica exited instead of resuming:\n%s", first.proc.Tail(30))
		}
	})

	t.Run("two replicas, never both forwarding", func(t *testing.T) {
		site := env.NewSite("a2", harness.SiteOptions{LAN: lan, PodCIDR: a.Site.PodCIDR})
		a.CP.ExposeTo(site.Netns)
		// The pod a's replicas forward to, behind the second as behind the
		// first: a pod network reached through whichever is active.
		viaSecond := *a
		viaSecond.Pod = site.AddPod("p", a.Pod.Addr)
		viaSecond.Pod.ServeTCP(federation.PodPort)
		second := replica{name: "a2", site: site, iface: env.LinkName("a2")}
		second.proc = site.Start("agent-a2", append(append([]string{a.Bin}, a.Args...),
			"--state-dir", filepath.Join(env.Dir, "state-a2"), "--advertise-addr", site.Addr.String(),
			"--wireguard-interface", second.iface, "--node-name", "a2", "--pod-name", "agent-a2")...)
		waitLog(t, second.proc, "standby: waiting for the Lease")
		waitLog(t, second.proc, "active replica")

		rec := record(t, first, second)
		cutAt := time.Now()
		cut := cutFromAPIServer(t, a.CP, first.site)
		eventually.Within(t, 90*time.Second, "the second replica forwards, the first does not", func() error {
			if s := rec.last(); !s.up[1] || s.up[0] {
				return fmt.Errorf("links up: a1 %v, a2 %v", s.up[0], s.up[1])
			}
			return nil
		})
		waitLogs(t, first.proc, "removing the data path", 2)
		// Peers follow the new active replica while the old one, cut
		// off from the API server only, still runs.
		eventually.Within(t, 60*time.Second, "b reaches a through the second replica", func() error {
			return federation.Exchange(t, b, &viaSecond).Err
		})
		// The witness of the fence's reason: the first was still running
		// when it removed its data path, not stopped.
		if exited, _ := first.proc.Exited(); exited {
			t.Fatalf("the first replica exited instead of being fenced:\n%s", first.proc.Tail(30))
		}
		cut.heal(t)
		select {
		case <-first.proc.Done():
		case <-time.After(60 * time.Second):
			t.Fatalf("the fenced replica did not stop once it could read the Lease:\n%s", first.proc.Tail(30))
		}
		waitLog(t, first.proc, "another replica holds the Lease")
		samples, errs := rec.stop()
		if len(errs) > 0 {
			t.Fatalf("links not read: %v", errs)
		}
		both, upFirst, upSecond := 0, false, false
		for _, s := range samples {
			if s.up[0] && s.up[1] {
				both++
			}
			upFirst = upFirst || s.up[0]
			upSecond = upSecond || s.up[1]
		}
		var downAt, upAt time.Time
		for _, s := range samples {
			if downAt.IsZero() && s.at.After(cutAt) && !s.up[0] {
				downAt = s.at
			}
			if upAt.IsZero() && s.up[1] {
				upAt = s.at
			}
		}
		t.Logf("%d samples of both replicas' links; after the cut, the first's link gone at %.2fs, the second's up at %.2fs",
			len(samples), downAt.Sub(cutAt).Seconds(), upAt.Sub(cutAt).Seconds())
		if !upFirst || !upSecond {
			t.Fatalf("links seen up: a1 %v, a2 %v; want each up at some point", upFirst, upSecond)
		}
		if both > 0 {
			t.Errorf("both replicas' links up in %d of %d samples", both, len(samples))
		}
		if up, err := first.linkUp(first.handle(t)); err != nil || up {
			t.Errorf("the stopped replica's link: up %v, %v; want gone", up, err)
		}
		l, err := a.CP.Client.CoordinationV1().Leases(federation.AgentNamespace).Get(t.Context(), ha.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || !strings.HasPrefix(*l.Spec.HolderIdentity, "a2_") {
			t.Fatalf("Lease %v, %v; want held by a2", l.Spec.HolderIdentity, err)
		}
		federation.WaitPhases(t, cs[1:], v1alpha1.PhaseConnected, 90*time.Second)
	})
}

// agentPod makes a pod object the agent's replicas count as one of them
// (ha.Replicas); nothing runs it.
func agentPod(t *testing.T, c *federation.Cluster, name string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "flotilla"}}},
	}
	if _, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitLog(t *testing.T, p *harness.Process, line string) {
	t.Helper()
	waitLogs(t, p, line, 1)
}

// waitLogs waits until p has logged line n times.
func waitLogs(t *testing.T, p *harness.Process, line string, n int) {
	t.Helper()
	eventually.Within(t, 90*time.Second, fmt.Sprintf("%s logs %q %d times", p.Name, line, n), func() error {
		if strings.Count(p.Log(), line) < n {
			return fmt.Errorf("last lines:\n%s", p.Tail(15))
		}
		return nil
	})
}

// replica is one of the agent's replicas, on a site of its own.
type replica struct {
	name  string
	site  *harness.Site
	iface string
	proc  *harness.Process
}

// linkUp reports whether the replica's WireGuard link exists and is up,
// read by a netlink handle of the caller's own in the replica's site.
func (r replica) linkUp(nl *netlink.Handle) (bool, error) {
	l, err := nl.LinkByName(r.iface)
	switch {
	case err == nil:
		return l.Attrs().Flags&net.FlagUp != 0, nil
	case errors.As(err, new(netlink.LinkNotFoundError)):
		return false, nil
	}
	return false, fmt.Errorf("link %s in %s: %w", r.iface, r.site.Name, err)
}

// handle is a netlink handle in the replica's site, closed at the test's end.
func (r replica) handle(t *testing.T) *netlink.Handle {
	t.Helper()
	nl, err := netlink.NewHandleAt(r.site.Handle())
	if err != nil {
		t.Fatalf("netlink in %s: %v", r.site.Name, err)
	}
	t.Cleanup(nl.Close)
	return nl
}

func (r replica) routes(t *testing.T) string {
	t.Helper()
	out, err := r.site.Exec(context.Background(), "ip", "route", "show", "table", "all", "dev", r.iface)
	if err != nil {
		t.Fatalf("routes of %s: %v: %s", r.iface, err, out)
	}
	return strings.TrimSpace(string(out))
}

// apiCut drops a site's packets to an API server.
type apiCut struct {
	site *harness.Site
}

// cutFromAPIServer drops every packet from site to cp's API server (the
// address ExposeTo gives it), in an nftables table of the test's own,
// until heal or the test's end.
func cutFromAPIServer(t *testing.T, cp *harness.ControlPlane, site *harness.Site) *apiCut {
	t.Helper()
	rules := fmt.Sprintf(`table inet flotest_apicut {
	chain out {
		type filter hook output priority 0; policy accept;
		ip daddr %s tcp dport %d drop comment "the test cuts this site off from its API server"
	}
}
`, cp.Addr.Addr(), cp.Addr.Port())
	path := filepath.Join(t.TempDir(), "apicut.nft")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := site.Exec(context.Background(), "nft", "-f", path); err != nil {
		t.Fatalf("cut %s from the API server: %v: %s", site.Name, err, out)
	}
	c := &apiCut{site: site}
	t.Cleanup(func() { c.site.Exec(context.Background(), "nft", "delete", "table", "inet", "flotest_apicut") })
	return c
}

func (c *apiCut) heal(t *testing.T) {
	t.Helper()
	if out, err := c.site.Exec(context.Background(), "nft", "delete", "table", "inet", "flotest_apicut"); err != nil {
		t.Fatalf("heal %s's cut from the API server: %v: %s", c.site.Name, err, out)
	}
}

// linkSample is whether each replica's WireGuard link was up at one
// instant.
type linkSample struct {
	at time.Time
	up [2]bool
}

type linkRecorder struct {
	mu      sync.Mutex
	samples []linkSample
	errs    []string
	done    chan struct{}
	stopped chan struct{}
}

// record samples both replicas' links every 10 ms until stop.
func record(t *testing.T, r0, r1 replica) *linkRecorder {
	rec := &linkRecorder{done: make(chan struct{}), stopped: make(chan struct{})}
	handles := []*netlink.Handle{r0.handle(t), r1.handle(t)}
	go func() {
		defer close(rec.stopped)
		for {
			var s linkSample
			s.at = time.Now()
			for i, r := range []replica{r0, r1} {
				up, err := r.linkUp(handles[i])
				if err != nil {
					rec.mu.Lock()
					rec.errs = append(rec.errs, err.Error())
					rec.mu.Unlock()
				}
				s.up[i] = up
			}
			rec.mu.Lock()
			rec.samples = append(rec.samples, s)
			rec.mu.Unlock()
			select {
			case <-rec.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { rec.stop() })
	return rec
}

func (r *linkRecorder) last() linkSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) == 0 {
		return linkSample{}
	}
	return r.samples[len(r.samples)-1]
}

func (r *linkRecorder) stop() ([]linkSample, []string) {
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	<-r.stopped
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.samples, r.errs
}
