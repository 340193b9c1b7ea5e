package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A standby lists the Peers and Nodes while it waits for the Lease and
// follows their changes; once it holds the Lease, its peering hears every
// Peer's spec from that informer, without listing them again.
func TestStandbyListsAheadOfTakeover(t *testing.T) {
	cp, _ := electionPlane(t)
	ctx := t.Context()
	if err := harness.ApplyCRDs(ctx, cp.Config, deploy.CRDs, "crds/*.yaml"); err != nil {
		t.Fatal(err)
	}
	w, err := client.New(cp.Config, client.Options{Scheme: peerapi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	addPeer := func(name string) {
		t.Helper()
		if err := w.Create(ctx, &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	addNode := func(name string) {
		t.Helper()
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const before, during = "2b2b2b2b-0000-4000-8000-000000000001", "2b2b2b2b-0000-4000-8000-000000000002"
	addPeer(before)
	addNode("node-before")

	first := runReplica(t, cp, "gw1", nil, nil)
	first.waitStarted(t, "the first replica")

	// The second replica's requests for Peers, counted; its peering, once
	// active, runs on what it listed as the standby.
	var lists atomic.Int32
	specs := &seenSpecs{}
	var second *replica
	second = runReplica(t, cp, "gw2", func(ctx context.Context, comps *components) error {
		objects := second.a.warm.peerObjects()
		if objects == nil {
			return fmt.Errorf("no warm Peer informer at the takeover")
		}
		comps.Go("Peer objects", func(ctx context.Context) error { return objects.Run(ctx, specs) })
		return startStep(ctx, objects.Synced(), "Peer informer not synced")
	}, func(a *Agent) {
		a.restCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/peers") && r.URL.Query().Get("watch") != "true" {
					lists.Add(1)
				}
				return rt.RoundTrip(r)
			})
		})
	})
	eventually.Within(t, 30*time.Second, "the standby warm", func() error {
		if !strings.Contains(second.log.String(), "standby warm") {
			return fmt.Errorf("its log:\n%s", second.log)
		}
		return nil
	})
	warm := second.a.warm // set before it logged
	addPeer(during)
	addNode("node-during")
	eventually.Within(t, 30*time.Second, "the standby's informers follow what changed", func() error {
		var p v1alpha1.Peer
		if err := warm.peers.Reader().Get(ctx, client.ObjectKey{Name: during}, &p); err != nil {
			return err
		}
		if _, ok, _ := warm.nodes.GetStore().GetByKey("node-during"); !ok {
			return fmt.Errorf("node-during not in the standby's Node informer")
		}
		return nil
	})
	select {
	case <-second.started:
		t.Fatal("the standby started its components while the other replica is active")
	default:
	}
	listed := lists.Load()
	if listed == 0 {
		t.Fatal("the standby's Peer requests were not counted: it listed none")
	}

	first.cancel()
	if err := <-first.ran; err != nil {
		t.Fatalf("the first replica stopped with %v", err)
	}
	first.ran <- nil // for its cleanup
	second.waitStarted(t, "the standby after the active one stopped")
	if got := specs.names(); !slices.Equal(got, []string{before, during}) {
		t.Fatalf("specs heard at the takeover %v, want %v", got, []string{before, during})
	}
	if n := lists.Load(); n != listed {
		t.Fatalf("the takeover listed the Peers again: %d lists, %d as the standby", n, listed)
	}
}

// A standby answers the clusterset zone from its own node's address while
// it waits for the Lease, and at takeover goes on with the same server:
// its zone was ready before it held the Lease and is not made again.
func TestStandbyAnswersClustersetDNS(t *testing.T) {
	cp, _ := electionPlane(t)
	ctx := t.Context()
	if err := harness.ApplyCRDs(ctx, cp.Config, deploy.CRDs, "crds/*.yaml"); err != nil {
		t.Fatal(err)
	}
	// One port, each replica on an address of its own, as on two nodes.
	l, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.LocalAddr().(*net.UDPAddr).Port
	l.Close()
	// A replica's start is the agent's start of the DNS.
	run := func(node, addr string) *replica {
		var agent *Agent
		return runReplica(t, cp, node, func(ctx context.Context, comps *components) error {
			return agent.startClustersetDNS(ctx, comps)
		}, func(a *Agent) {
			agent = a
			a.cfg.NodeAddress, a.cfg.ClustersetDNSPort = netip.MustParseAddr(addr), port
		})
	}
	first := run("gw1", "127.0.0.2")
	first.waitStarted(t, "the first replica")

	w, err := client.New(cp.Config, client.Options{Scheme: mcs.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}},
		&mcsv1alpha1.ServiceImport{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{mcs.LabelManagedBy: mcs.ManagedBy}},
			Spec: mcsv1alpha1.ServiceImportSpec{Type: mcsv1alpha1.ClusterSetIP, IPs: []string{"10.100.0.7"},
				Ports: []mcsv1alpha1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
		},
	} {
		if err := w.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	second := run("gw2", "127.0.0.3")
	standby := fmt.Sprintf("127.0.0.3:%d", port)
	answers := func(what string) {
		t.Helper()
		eventually.Within(t, 30*time.Second, what, func() error {
			req := new(dns.Msg)
			req.SetQuestion("web.shop.svc.clusterset.local.", dns.TypeA)
			resp, _, err := (&dns.Client{Timeout: 2 * time.Second}).ExchangeContext(ctx, req, standby)
			switch {
			case err != nil:
				return err
			case resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || !strings.Contains(resp.Answer[0].String(), "10.100.0.7"):
				return fmt.Errorf("answer %v", resp)
			}
			return nil
		})
	}
	answers("the standby answering the zone")
	select {
	case <-second.started:
		t.Fatal("the standby started its components while the other replica is active")
	default:
	}

	first.cancel()
	if err := <-first.ran; err != nil {
		t.Fatalf("the first replica stopped with %v", err)
	}
	first.ran <- nil // for its cleanup
	second.waitStarted(t, "the standby after the active one stopped")
	answers("the new active replica answering the zone")
	if n := strings.Count(second.log.String(), "clusterset zone ready"); n != 1 {
		t.Fatalf("the zone was made %d times by the replica that took over, want once, as the standby; its log:\n%s", n, second.log)
	}
}

// seenSpecs records the Peers whose specs were reported.
type seenSpecs struct {
	mu   sync.Mutex
	seen []string
}

func (s *seenSpecs) SpecChanged(id string, _ peering.Spec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.seen, id) {
		s.seen = append(s.seen, id)
	}
}

func (s *seenSpecs) SpecDeleted(string) {}

func (s *seenSpecs) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.seen))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
