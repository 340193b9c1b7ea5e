package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy/policyapi"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// peerOf is c's Peer for o.
func peerOf(t *testing.T, c, o *federation.Cluster) v1alpha1.Peer {
	t.Helper()
	peers, err := c.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p, ok := peers[o.Name]
	if !ok {
		t.Fatalf("%s has no Peer for %s", c.Name, o.Name)
	}
	return p
}

// setTraffic writes spec.traffic of c's Peer for o, as an admin does.
func setTraffic(t *testing.T, c, o *federation.Cluster, mode v1alpha1.Traffic) {
	t.Helper()
	p := peerOf(t, c, o)
	patch := client.RawPatch("application/merge-patch+json", []byte(fmt.Sprintf(`{"spec":{"traffic":%q}}`, mode)))
	if err := c.Client.Patch(context.Background(), &p, patch); err != nil {
		t.Fatal(err)
	}
}

// waitTraffic waits until c's Peer for o says mode is in effect, which
// the agent writes once the data path has it.
func waitTraffic(t *testing.T, c, o *federation.Cluster, mode v1alpha1.Traffic) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s's Peer for %s says %s", c.Name, o.Name, mode), func() error {
		if p := peerOf(t, c, o); p.Status.Traffic != mode {
			return fmt.Errorf("status.traffic %q", p.Status.Traffic)
		}
		return nil
	})
}

var dropCounter = regexp.MustCompile(`counter packets (\d+) bytes \d+ drop`)

// dropped is what the drop rule of c's filter for peer id has counted.
func dropped(t *testing.T, c *federation.Cluster, id string) uint64 {
	t.Helper()
	out := c.Site.MustExec("nft", "list", "chain", "ip", tunnel.PolicyTable(tunnel.DefaultNFTable), "from-"+id)
	m := dropCounter.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no drop counter in chain from-%s:\n%s", id, out)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

// Segregated through the agent, on a live peering: a's admin sets its
// Peer for b to Segregated, and b's pod, given nothing by a, no longer
// reaches a's pod (dropped and counted) while a's pod still reaches b's
// (replies pass); across a restart of a's agent it stays so; back to Full
// b reaches a again.
func TestSegregatedPeerThroughTheAgent(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.244.0.0/16", "10.245.0.0/16"}})
	a, b := cs[0], cs[1]
	federation.Connect(t, cs)
	if r := federation.Exchange(t, b, a); r.Err != nil {
		t.Fatalf("b to a while Full: %v", r.Err)
	}
	waitTraffic(t, a, b, v1alpha1.TrafficFull)
	bID := peerOf(t, a, b).Name

	setTraffic(t, a, b, v1alpha1.TrafficSegregated)
	waitTraffic(t, a, b, v1alpha1.TrafficSegregated)
	if p := peerOf(t, a, b); p.Status.Allowed == nil || *p.Status.Allowed != (v1alpha1.TrafficAllowed{}) {
		t.Errorf("a's Peer for b allows %+v; want nothing", p.Status.Allowed)
	}
	refusedAfterWitness := func(when string) {
		t.Helper()
		if r := federation.Exchange(t, a, b); r.Err != nil {
			t.Fatalf("%s: a to b: %v; a's own connections get their replies", when, r.Err)
		}
		before := dropped(t, a, bID)
		if r := federation.Exchange(t, b, a); r.Err == nil {
			t.Errorf("%s: b reached a's pod; want it dropped", when)
		}
		if after := dropped(t, a, bID); after <= before {
			t.Errorf("%s: a's drop counter for b %d, then %d; want it to grow", when, before, after)
		}
	}
	refusedAfterWitness("Segregated")
	// What an operator reads on a's agent.
	metrics := scrape(t, a)
	for _, want := range []string{
		fmt.Sprintf(`flotilla_tunnel_policy_dropped_packets_total{peer="%s",peer_name="b",reason="not_allowed"}`, bID),
		fmt.Sprintf(`flotilla_tunnel_policy_set_elements{peer="%s",peer_name="b",set="pods"} 0`, bID),
		`flotilla_policy_input_errors{kind="Pod"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("a's metrics lack %s", want)
		}
	}
	if m := regexp.MustCompile(`flotilla_policy_update_latency_seconds_count (\d+)`).FindStringSubmatch(metrics); m == nil || m[1] == "0" {
		t.Errorf("a's agent observed no update latency after b became Segregated: %v", m)
	}

	if err := a.Agent.Stop(); err != nil {
		t.Fatalf("stop a's agent: %v", err)
	}
	if l := a.Site.MustExec("nft", "list", "table", "ip", tunnel.PolicyTable(tunnel.DefaultNFTable)); !strings.Contains(l, "from-"+bID) {
		t.Errorf("a's filter for b gone while its agent is down:\n%s", l)
	}
	a.StartAgent(t)
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
	waitTraffic(t, a, b, v1alpha1.TrafficSegregated)
	refusedAfterWitness("after a's agent restarted")
	if !strings.Contains(a.Agent.Log(), "holding the Segregated peers' sets found in the kernel") {
		t.Errorf("a's agent did not say it held the kernel's sets at start")
	}

	setTraffic(t, a, b, v1alpha1.TrafficFull)
	waitTraffic(t, a, b, v1alpha1.TrafficFull)
	if r := federation.Exchange(t, b, a); r.Err != nil {
		t.Errorf("b to a back to Full: %v", r.Err)
	}
}

// scrape reads c's agent's metrics, in its gateway's namespace.
func scrape(t *testing.T, c *federation.Cluster) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: c.Site.DialContext}}
	resp, err := hc.Get("http://127.0.0.1:9470/metrics")
	if err != nil {
		t.Fatalf("metrics of %s's agent: %v", c.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("metrics of %s's agent: %v", c.Name, err)
	}
	return string(b)
}

// BenchmarkSegregatedPodToKernel: through a real agent and kernel, a pod
// of a Segregated consumer gets its address here (its status written, as
// its kubelet's) until the element is in the consumer's pods set in the
// gateway's kernel, while the cluster exports 10,000 service endpoints
// (100 slices of 100) that the consumer's services set holds: the API
// server's write and watch, the feed, the decision, the engine's data path
// and the kernel's transaction. Median, min and max in milliseconds.
//
//	go test ./agent -run '^$' -bench SegregatedPodToKernel -benchtime 21x
func BenchmarkSegregatedPodToKernel(b *testing.B) {
	harness.Require(b, harness.NeedsControlPlane...)
	harness.Require(b, harness.NeedsNetwork...)
	env := harness.New(b)
	cs := federation.New(b, env, federation.Options{PodCIDRs: []string{"10.244.0.0/16", "10.245.0.0/16"}})
	a, bc := cs[0], cs[1]
	federation.Connect(b, cs)
	peers, err := a.Peers(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	peer := peers[bc.Name]
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"traffic":"Segregated"}}`))
	if err := a.Client.Patch(b.Context(), &peer, patch); err != nil {
		b.Fatal(err)
	}
	// This cluster's objects as the agent finds them: a tenant namespace
	// of b's with pods, and an exported Service of 10,000 endpoints.
	c, err := client.New(a.CP.Config, client.Options{Scheme: policyapi.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	e := kubeWriter{tb: b, c: c}
	e.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-tenant-bench",
		Labels: map[string]string{offload.LabelTenant: peer.Name, v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web"}})
	tcp, port := corev1.ProtocolTCP, int32(8443)
	e.create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(port), Protocol: tcp}}}})
	e.create(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "front", discoveryv1.LabelManagedBy: "test"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: &port, Protocol: &tcp}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.200.1"}}}})
	for i := range 100 {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: fmt.Sprintf("front-big-%d", i),
			Labels: map[string]string{discoveryv1.LabelServiceName: "front", discoveryv1.LabelManagedBy: "test"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: &port, Protocol: &tcp}}}
		for j := range 100 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", 100+i, j+1)}})
		}
		e.create(es)
	}
	e.create(&mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}})

	nft, err := nftables.New(nftables.WithNetNSFd(int(a.Site.Handle())))
	if err != nil {
		b.Fatal(err)
	}
	table := &nftables.Table{Name: tunnel.PolicyTable(tunnel.DefaultNFTable), Family: nftables.TableFamilyIPv4}
	elements := func(set string) ([]nftables.SetElement, error) {
		return nft.GetSetElements(&nftables.Set{Table: table, Name: set + "-" + peer.Name})
	}
	eventually.Within(b, 2*time.Minute, "b's services set holds the 10,001 exported endpoints", func() error {
		els, err := elements("services")
		if err != nil || len(els) != 10001 {
			return fmt.Errorf("%d elements, %v", len(els), err)
		}
		return nil
	})
	inKernel := func(ip netip.Addr) bool {
		els, err := elements("pods")
		if err != nil {
			return false
		}
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok && a == ip {
				return true
			}
		}
		return false
	}

	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		ip := netip.AddrFrom4([4]byte{10, 244, 1, byte(i%250 + 1)})
		b.StopTimer()
		p := e.newPod("flotilla-tenant-bench", fmt.Sprintf("pod-%d", i))
		time.Sleep(2 * policyapi.DefaultDebounce)
		b.StartTimer()
		start := time.Now()
		e.startPod(p, ip.String())
		for !inKernel(ip) {
			if time.Since(start) > 30*time.Second {
				b.Fatalf("pod %s not in the kernel's set after 30s", ip)
			}
			time.Sleep(200 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(lat[len(lat)/2]), "median-ms")
	b.ReportMetric(ms(lat[0]), "min-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}

// kubeWriter writes a cluster's objects as its users, controllers and
// kubelets do.
type kubeWriter struct {
	tb testing.TB
	c  client.Client
}

func (w kubeWriter) create(objs ...client.Object) {
	w.tb.Helper()
	for _, o := range objs {
		if err := w.c.Create(w.tb.Context(), o); err != nil {
			w.tb.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func (w kubeWriter) newPod(ns, name string) *corev1.Pod {
	w.tb.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	w.create(p)
	return p
}

// startPod gives p the address a kubelet would.
func (w kubeWriter) startPod(p *corev1.Pod, ip string) {
	w.tb.Helper()
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if err := w.c.Status().Update(w.tb.Context(), p); err != nil {
		w.tb.Fatalf("pod %s/%s status: %v", p.Namespace, p.Name, err)
	}
}
