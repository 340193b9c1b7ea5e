package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Segregated traffic (docs/policy.md), three matrices of yes/no TCP
// exchanges between real pods of three clusters: a offloads shop to b and
// c; b exports echo.
// The tables are printed; a row that differs fails the test.

// trafficFixture is what the services test has built when the matrices
// run.
type trafficFixture struct {
	a, b, c       *federation.NodeCluster
	aID, bID, cID string
	shopOnB       string
	// app runs on b for a, far on c for a; home and secret run on a's
	// gateway, home behind a Service reflected to b and c, secret behind
	// none. echo runs on b and b exports it (port 8080 only).
	app, far, home, secret, echo corev1.Pod
}

// exchange is one row of a matrix: a TCP exchange from a pod to an
// address, and whether the filter of cluster filter lets it through from
// its peer peer.
type exchange struct {
	from     string // the calling pod, in words
	to       string // the destination, in words
	exec     *federation.NodeCluster
	ns, pod  string // the calling pod, as exec's API server names it
	target   netip.AddrPort
	http     bool       // GET / over HTTP; else one line to the TCP echo
	answerer corev1.Pod // the pod at target, as filter's API has it
	want     bool
	filter   *federation.NodeCluster
	peerID   string // the sender as filter names it
	peerName string
}

// try makes the exchange and returns what the server answered, or an
// error when it did not go through.
func (e exchange) try() (string, error) {
	args := []string{"-n", e.ns, "exec", e.pod, "--", "/testserver"}
	if e.http {
		args = append(args, "-get", fmt.Sprintf("http://%s/", e.target))
	} else {
		args = append(args, "-dial", e.target.String())
	}
	return federation.Kubectl(e.exec.CP, args...)
}

// answeredBy checks that out, what try returned, came from e.answerer:
// the pods of the three clusters share a pod network, so an exchange
// that went through may still have reached another pod than the row's.
func (e exchange) answeredBy(out string) error {
	parse := harness.ParseHello
	if e.http {
		parse = federation.ParseAnswer
	}
	a, err := parse(out)
	if err != nil {
		return err
	}
	return federation.AnsweredBy(a, e.filter.Name, e.answerer)
}

func (e exchange) String() string {
	proto := "tcp"
	if e.http {
		proto = "http"
	}
	return fmt.Sprintf("%s → %s (%s %s)", e.from, e.to, proto, e.target)
}

// runMatrix checks every row and prints the table. Rows that must pass
// are retried for a while (the filter follows informers), and pass only
// when the row's pod answered; a row that must fail is tried once, after
// a row through the same filter from the same peer passed, and must raise
// the filter's drop counter for that peer.
func runMatrix(t *testing.T, title string, rows []exchange) {
	t.Helper()
	got := make([]bool, len(rows))
	for i, r := range rows {
		if !r.want {
			continue
		}
		var out string
		err := retry(60*time.Second, func() (err error) {
			out, err = r.try()
			return err
		})
		if err != nil {
			t.Errorf("%s: refused, want it through: %v", r, err)
			continue
		}
		if err := r.answeredBy(out); err != nil {
			t.Errorf("%s: went through, but %v", r, err)
			continue
		}
		got[i] = true
	}
	for i, r := range rows {
		if r.want {
			continue
		}
		if !witnessed(rows, got, r) {
			t.Errorf("%s: no allowed row through %s's filter from %s passed first; the refusal would prove nothing", r, r.filter.Name, r.peerName)
			continue
		}
		before := droppedFrom(t, r.filter, r.peerID)
		_, err := r.try()
		got[i] = err == nil
		if err == nil {
			t.Errorf("%s: went through, want it dropped by %s's filter", r, r.filter.Name)
			continue
		}
		eventually.Within(t, 15*time.Second, r.filter.Name+"'s drop counter for "+r.peerName+" to rise", func() error {
			if after := droppedFrom(t, r.filter, r.peerID); after <= before {
				return fmt.Errorf("flotilla_tunnel_policy_dropped_packets_total{peer=%s} on %s is %v, was %v", r.peerID, r.filter.Name, after, before)
			}
			return nil
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n| from | to | exchange | filter | want | got |\n| --- | --- | --- | --- | --- | --- |\n", title)
	for i, r := range rows {
		proto := "tcp"
		if r.http {
			proto = "http"
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s, from %s | %s | %s |\n", r.from, r.to, proto, r.target, r.filter.Name, r.peerName, yesNo(r.want), yesNo(got[i]))
	}
	t.Log(b.String())
}

// retry calls f until it succeeds or d has passed, and returns its last
// error: a row that fails is reported with the others, not fatally.
func retry(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// witnessed reports whether a row through the same filter from the same
// peer was allowed and passed.
func witnessed(rows []exchange, got []bool, r exchange) bool {
	for i, o := range rows {
		if o.want && got[i] && o.filter == r.filter && o.peerID == r.peerID {
			return true
		}
	}
	return false
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// droppedFrom is the packets c's filter dropped from peer, 0 while the
// peer has no chain.
func droppedFrom(t *testing.T, c *federation.NodeCluster, peer string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(agentMetrics(t, c)))
	if err != nil {
		t.Fatalf("metrics of %s's agent: %v", c.Name, err)
	}
	var sum float64
	for _, m := range families["flotilla_tunnel_policy_dropped_packets_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "peer" && l.GetValue() == peer {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// setTraffic sets spec.traffic of every Peer of every cluster and waits
// until each cluster's Peers report it in effect.
func setTraffic(t *testing.T, mode v1alpha1.Traffic, cs ...*federation.NodeCluster) {
	t.Helper()
	for _, c := range cs {
		peers, err := c.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range peers {
			mustKubectl(t, c.CP, "patch", "peer", p.Name, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"traffic":%q}}`, mode))
		}
	}
	for _, c := range cs {
		eventually.Within(t, 60*time.Second, "every Peer of "+c.Name+" "+string(mode)+" in effect", func() error {
			peers, err := c.Peers(context.Background())
			if err != nil {
				return err
			}
			for name, p := range peers {
				if p.Status.Traffic != mode {
					return fmt.Errorf("%s's Peer for %s: traffic in effect %q, want %q", c.Name, name, p.Status.Traffic, mode)
				}
			}
			return nil
		})
	}
}

// segregatedMatrices runs the three matrices under Segregated, with a
// row of each under Full before and after, on the live peers.
func segregatedMatrices(t *testing.T, fx trafficFixture) {
	a, b, c := fx.a, fx.b, fx.c
	ip := func(p corev1.Pod) netip.Addr { return netip.MustParseAddr(p.Status.PodIP) }
	at := func(addr netip.Addr, port int) netip.AddrPort { return netip.AddrPortFrom(addr, uint16(port)) }
	httpPort, tcpPort := harness.TestServerHTTPPort, harness.TestServerTCPPort
	clusterIP := func(cl *federation.NodeCluster, ns, name string) netip.Addr {
		svc, err := cl.CP.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Service %s/%s on %s: %v", ns, name, cl.Name, err)
		}
		return netip.MustParseAddr(svc.Spec.ClusterIP)
	}

	fromA := func(to string, answerer corev1.Pod, target netip.AddrPort, http, want bool, filter *federation.NodeCluster, peerID string) exchange {
		return exchange{from: a.Name + "'s pod", to: to, exec: a, ns: a.Web.Namespace, pod: a.Web.Name, target: target, http: http, answerer: answerer, want: want, filter: filter, peerID: peerID, peerName: a.Name}
	}
	fromApp := func(to string, answerer corev1.Pod, target netip.AddrPort, http, want bool, filter *federation.NodeCluster) exchange {
		return exchange{from: "a's pod offloaded to " + b.Name, to: to, exec: a, ns: "shop", pod: fx.app.Name, target: target, http: http, answerer: answerer, want: want, filter: filter, peerID: fx.bID, peerName: b.Name}
	}
	// An offloaded pod answers with its UID on its provider, not on a.
	// shop has the same name on every provider (it depends on the
	// consumer only).
	onProvider := func(cl *federation.NodeCluster, p corev1.Pod) corev1.Pod {
		got, err := cl.CP.Client.CoreV1().Pods(fx.shopOnB).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s/%s on %s: %v", fx.shopOnB, p.Name, cl.Name, err)
		}
		return *got
	}
	appOnB, farOnC := onProvider(b, fx.app), onProvider(c, fx.far)
	bWebOnA := federation.ViewOf(t, a.Cluster, b.Cluster, ip(b.Web))
	secretOnB := federation.ViewOf(t, b.Cluster, a.Cluster, ip(fx.secret))
	homeOnB := federation.ViewOf(t, b.Cluster, a.Cluster, ip(fx.home))
	cWebOnB := federation.ViewOf(t, b.Cluster, c.Cluster, ip(c.Web))
	echoOnA := federation.ViewOf(t, a.Cluster, b.Cluster, ip(fx.echo))

	// The rows that Segregated turns from yes to no, under Full first:
	// the witness that what Segregated refuses is otherwise reachable.
	fullRows := func() []exchange {
		return []exchange{
			fromA(b.Name+"'s own pod", b.Web, at(bWebOnA, httpPort), true, true, b, fx.aID),
			fromApp(a.Name+"'s pod behind no Service", fx.secret, at(secretOnB, httpPort), true, true, a),
			fromApp(c.Name+"'s own pod", c.Web, at(cWebOnB, httpPort), true, true, c),
		}
	}
	runMatrix(t, "Full: every pod of each cluster", fullRows())

	setTraffic(t, v1alpha1.TrafficSegregated, a, b, c)

	t.Run("into b from a: a peer reaches its offloaded pods and what was exported to it", func(t *testing.T) {
		runMatrix(t, "Segregated, into "+b.Name+" from "+a.Name, []exchange{
			fromA("its pod offloaded to "+b.Name, appOnB, at(ip(fx.app), httpPort), true, true, b, fx.aID),
			fromA("its pod offloaded to "+b.Name+", another port", appOnB, at(ip(fx.app), tcpPort), false, true, b, fx.aID),
			fromA(b.Name+"'s exported echo, its port", fx.echo, at(echoOnA, httpPort), true, true, b, fx.aID),
			fromA(b.Name+"'s exported echo, another port", fx.echo, at(echoOnA, tcpPort), false, false, b, fx.aID),
			fromA(b.Name+"'s own pod", b.Web, at(bWebOnA, httpPort), true, false, b, fx.aID),
		})
	})
	t.Run("into a from b: an offloaded pod reaches the home Services reflected to it and no other home pod", func(t *testing.T) {
		homeSvc := clusterIP(b, fx.shopOnB, "home")
		runMatrix(t, "Segregated, into "+a.Name+" from "+b.Name, []exchange{
			fromApp("home by its reflected Service", fx.home, at(homeSvc, httpPort), true, true, a),
			fromApp("home's endpoint, the Service's port", fx.home, at(homeOnB, httpPort), true, true, a),
			fromApp("home's endpoint, another port", fx.home, at(homeOnB, tcpPort), false, false, a),
			fromApp(a.Name+"'s pod behind no Service", fx.secret, at(secretOnB, httpPort), true, false, a),
		})
	})
	t.Run("into c from b: a Service offloaded to a peer reaches its endpoint on a third cluster", func(t *testing.T) {
		farSvc := clusterIP(b, fx.shopOnB, "far")
		runMatrix(t, "Segregated, into "+c.Name+" from "+b.Name, []exchange{
			fromApp("far (a's pod on "+c.Name+") by the Service reflected to "+b.Name, farOnC, at(farSvc, httpPort), true, true, c),
			fromApp(c.Name+"'s own pod", c.Web, at(cWebOnB, httpPort), true, false, c),
		})
	})

	t.Run("unexported: a new connection is refused as soon as the sets shrink", func(t *testing.T) {
		allowed := func() int64 {
			if s := peerNamed(t, b, a.Name).Status.Allowed; s != nil {
				return s.Services
			}
			return 0
		}
		before := allowed()
		mustKubectl(t, b.CP, "-n", "mcs", "delete", "serviceexport", "echo")
		// The witness that b decided without echo: fewer endpoints
		// allowed to a than before.
		eventually.Within(t, 60*time.Second, b.Name+"'s sets for "+a.Name+" without echo", func() error {
			if n := allowed(); n >= before {
				return fmt.Errorf("%s's Peer for %s allows %d service endpoints, as before the unexport", b.Name, a.Name, n)
			}
			return nil
		})
		runMatrix(t, "Segregated, into "+b.Name+" from "+a.Name+", echo unexported", []exchange{
			fromA("its pod offloaded to "+b.Name, appOnB, at(ip(fx.app), httpPort), true, true, b, fx.aID),
			fromA(b.Name+"'s echo, no longer exported", fx.echo, at(echoOnA, httpPort), true, false, b, fx.aID),
		})
		mustKubectlApply(t, b, exportManifest("echo", "mcs"))
	})

	setTraffic(t, v1alpha1.TrafficFull, a, b, c)
	runMatrix(t, "Full again: every pod of each cluster", fullRows())

	// Everything above that went through crossed a tunnel's guards
	// (docs/tunnel.md) and the gateway node's (docs/fabric.md): none of
	// it, replies and ICMP included, may have been counted as sent back
	// into the tunnel, beyond the cluster's networks or out of the
	// gateway node other than by the tunnel. The rows that passed are
	// the witness that traffic came.
	t.Run("no legitimate packet met a guard", func(t *testing.T) {
		for _, cl := range []*federation.NodeCluster{a, b, c} {
			for _, name := range []string{"flotilla_tunnel_hairpin_dropped_packets_total", "flotilla_tunnel_beyond_dropped_packets_total"} {
				if v, ok := unlabelled(t, cl, name); !ok || v != 0 {
					t.Errorf("%s on %s's agent: %v (present %v), want 0", name, cl.Name, v, ok)
				}
			}
			// Nor did anything for another cluster leave a gateway node
			// other than by its tunnel (docs/fabric.md).
			const guard = "flotilla_fabric_guard_dropped_packets_total"
			byHook := counters(t, fabricMetrics(t, cl, cl.Gateway), guard, "hook")
			if len(byHook) != 2 || byHook["forward"] != 0 || byHook["output"] != 0 {
				t.Errorf("%s on %s's gateway node: %v, want forward and output at 0", guard, cl.Name, byHook)
			}
		}
	})
}

// unlabelled is the value of c's agent's metric name, one without labels,
// and whether it is there.
func unlabelled(t *testing.T, c *federation.NodeCluster, name string) (float64, bool) {
	t.Helper()
	v, ok := counters(t, agentMetrics(t, c), name, "")[""]
	return v, ok
}

// counters are the values of the counter name in the scraped text, by
// the value of its label (label "": one without labels, under "").
func counters(t *testing.T, text, name, label string) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	out := map[string]float64{}
	for _, m := range families[name].GetMetric() {
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				key = l.GetValue()
			}
		}
		out[key] = m.GetCounter().GetValue()
	}
	return out
}
