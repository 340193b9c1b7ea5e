package federation_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/observe/trace/collect"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestTraceNamesTheBrokenStep breaks the path between two clusters' pods
// one step at a time, on real agents and kernels, and checks that trace
// names that step, then that it is whole again once the break is undone.
// Each break is one the agent does not repair at once, so the trace sees
// it: it never touches a foreign rule or route, a denied Peer is the
// admin's decision, a WireGuard peer removed by hand comes back only at
// the tunnel's next resync (every 30 s: WireGuard edits send no event),
// and a stopped agent is gone until started. A deleted NAT element or
// route of ours is put back within milliseconds (nftables and route
// events), so the trace would race the repair: the model's tests cover
// those steps.
func TestTraceNamesTheBrokenStep(t *testing.T) {
	harness.Require(t, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16", "10.0.0.0/16"}})
	federation.Connect(t, cs)
	a, b := cs[0], cs[1]
	dst := federation.ViewOf(t, a, b, b.Pod.Addr)
	src := a.Pod.Addr
	tr := &tracer{a: a, b: b, src: src, dst: dst}

	healthy := tr.until(t, "", 60*time.Second)
	if r := federation.Exchange(t, a, b); r.Err != nil {
		t.Fatalf("the path is whole by trace, but a's pod cannot reach b's: %v\n%s", r.Err, text(healthy))
	}
	for _, id := range []string{trace.StepGatewayRoute, trace.StepSNAT, trace.StepWireGuard, trace.StepHandshake,
		trace.StepFarPeer, trace.StepFarWireGuard, trace.StepFarDNAT, trace.StepFarDelivery, trace.StepReturnGateway, trace.StepReturnDelivery} {
		if s := stepOf(healthy, id); s == nil || s.Verdict != trace.OK {
			t.Errorf("healthy path: step %s is %+v", id, s)
		}
	}
	if s := stepOf(healthy, trace.StepFarDNAT); s == nil || !strings.Contains(s.Found, b.Pod.Addr.String()) {
		t.Errorf("b's DNAT does not deliver to b's pod %s: %+v", b.Pod.Addr, s)
	}
	view24 := netip.PrefixFrom(dst, 24).Masked().String()

	t.Run("foreign rule shadows the tunnel's route", func(t *testing.T) {
		a.Site.MustExec("ip", "route", "add", "blackhole", view24, "table", "200")
		a.Site.MustExec("ip", "rule", "add", "priority", "100", "to", view24, "lookup", "200")
		s := tr.broken(t, trace.StepGatewayRoute)
		if !strings.Contains(s.Fix, "ip rule del priority 100") {
			t.Errorf("fix: %s", s.Fix)
		}
		a.Site.MustExec("ip", "rule", "del", "priority", "100")
		a.Site.MustExec("ip", "route", "del", "blackhole", view24, "table", "200")
		tr.until(t, "", 30*time.Second)
	})

	t.Run("foreign route in main shadows the tunnel's", func(t *testing.T) {
		a.Site.MustExec("ip", "route", "add", "blackhole", view24, "proto", "boot")
		s := tr.broken(t, trace.StepGatewayRoute)
		if !strings.Contains(s.Fix, "a foreign route (proto boot) in table main shadows ours: remove it: ip route del "+view24+" table main") {
			t.Errorf("fix: %s", s.Fix)
		}
		a.Site.MustExec("ip", "route", "del", "blackhole", view24, "proto", "boot")
		tr.until(t, "", 30*time.Second)
	})

	t.Run("WireGuard peer removed", func(t *testing.T) {
		key := peerOf(t, a, b).Status.PublicKey
		// The tunnel's resync (every 30 s) may put it back before the
		// trace reads it: remove it again until a trace has seen it gone.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			a.Site.MustExec("wg", "set", a.Interface(), "peer", key, "remove")
			r := tr.run(t)
			if r.Broken == trace.StepWireGuard {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("trace never named the WireGuard peer:\n%s", text(r))
			}
		}
		// The resync puts it back: the path is whole again within one.
		tr.until(t, "", 90*time.Second)
	})

	t.Run("far side stopped", func(t *testing.T) {
		// Killed, not stopped: a stopping agent says goodbye, and a's
		// Peer turns Unreachable at once. Killed, it answers nothing and
		// a notices only when gossip finds it dead; until then the trace
		// names b's agent, after that a's Peer of b, Unreachable.
		b.Agent.Kill()
		r := tr.until(t, trace.StepFarAgent, 30*time.Second, trace.StepPeer)
		t.Logf("%s", text(r))
		s := stepOf(r, r.Broken)
		switch r.Broken {
		case trace.StepFarAgent:
			if !strings.Contains(s.Fix, "is the agent running?") {
				t.Errorf("fix: %s", s.Fix)
			}
		case trace.StepPeer:
			if !strings.Contains(s.Found, "Unreachable") || !strings.Contains(s.Fix, "is its agent running?") {
				t.Errorf("step %+v", s)
			}
		}
		b.StartAgent(t)
		federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
		// The views may have been given anew.
		tr.dst = federation.ViewOf(t, a, b, b.Pod.Addr)
		tr.until(t, "", 60*time.Second)
	})

	t.Run("Peer denied", func(t *testing.T) {
		setNetworking(t, a, b, `"Deny"`)
		s := tr.broken(t, trace.StepPeer)
		if want := "flotilla peer accept " + peerOf(t, a, b).Name; !strings.Contains(s.Fix, want) {
			t.Errorf("fix %q, want %q", s.Fix, want)
		}
		setNetworking(t, a, b, "null")
		federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
		tr.until(t, "", 60*time.Second)
	})
	slices.Sort(tr.took)
	t.Logf("%d traces, both clusters read through their agents: median %s, min %s, max %s",
		len(tr.took), tr.took[len(tr.took)/2], tr.took[0], tr.took[len(tr.took)-1])
}

// tracer traces from a's pod to b's by a's view, reading both clusters
// as flotilla trace --peer-context does, with the agents' /trace read in
// their sites instead of through a pod proxy (they run as processes).
type tracer struct {
	a, b     *federation.Cluster
	src, dst netip.Addr
	// took is how long each trace took, reading both clusters included.
	took []time.Duration
}

func (tr *tracer) run(t *testing.T) trace.Result {
	t.Helper()
	start := time.Now()
	defer func() { tr.took = append(tr.took, time.Since(start)) }()
	ctx := context.Background()
	local, err := collect.Collect(ctx, source(tr.a), collect.Ends{Addrs: []netip.Addr{tr.src}})
	if err != nil {
		t.Fatalf("collect %s: %v", tr.a.Name, err)
	}
	remote, err := collect.Collect(ctx, source(tr.b), collect.Ends{Addrs: trace.Candidates(local, tr.dst.String())})
	if err != nil {
		t.Fatalf("collect %s: %v", tr.b.Name, err)
	}
	trace.Name(local, remote)
	return trace.Run(local, remote, tr.src.String(), tr.dst.String(), time.Now())
}

// until traces until the first broken step is want ("": none), or one
// of or.
func (tr *tracer) until(t *testing.T, want string, timeout time.Duration, or ...string) trace.Result {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := tr.run(t)
		if r.Broken == want || slices.Contains(or, r.Broken) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the first broken step is %q, want %q:\n%s", timeout, r.Broken, want, text(r))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// broken waits for the trace to name step id and returns it.
func (tr *tracer) broken(t *testing.T, id string) trace.Step {
	t.Helper()
	r := tr.until(t, id, 30*time.Second)
	t.Logf("%s", text(r))
	return *stepOf(r, id)
}

func source(c *federation.Cluster) collect.Source {
	return collect.Source{Name: c.Name, Config: c.CP.Config, Report: func(ctx context.Context, node string) (trace.NodeReport, error) {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return c.Site.DialContext(ctx, network, addr)
			}}}
		resp, err := hc.Get("http://127.0.0.1:9470/trace")
		if err != nil {
			return trace.NodeReport{}, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return trace.NodeReport{}, err
		}
		if resp.StatusCode != http.StatusOK {
			return trace.NodeReport{}, fmt.Errorf("%s: %s", resp.Status, body)
		}
		return trace.ParseNodeReport(body)
	}}
}

func peerOf(t *testing.T, c, of *federation.Cluster) v1alpha1.Peer {
	t.Helper()
	peers, err := c.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p, ok := peers[of.Name]
	if !ok {
		t.Fatalf("%s has no Peer for %s", c.Name, of.Name)
	}
	return p
}

func setNetworking(t *testing.T, c, of *federation.Cluster, value string) {
	t.Helper()
	p := peerOf(t, c, of)
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"networking":`+value+`}}`))
	if err := c.Client.Patch(context.Background(), &p, patch); err != nil {
		t.Fatalf("patch %s's Peer %s: %v", c.Name, p.Name, err)
	}
}

func stepOf(r trace.Result, id string) *trace.Step {
	for i := range r.Steps {
		if r.Steps[i].ID == id {
			return &r.Steps[i]
		}
	}
	return nil
}

func text(r trace.Result) string {
	var b strings.Builder
	trace.WriteText(&b, r)
	return b.String()
}
