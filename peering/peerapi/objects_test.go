package peerapi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Against a real API server: the engine's states become Peer objects, and
// status.observedGeneration names the spec the engine acted on, not the
// object's generation at the time of the write. A deleted Peer comes back.
func TestPeerObjects(t *testing.T) {
	cfg, c := apiServer(t)

	log := slog.New(slog.DiscardHandler)
	objects, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t, objects, log)
	specs := &gate{eng: eng}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- objects.Run(ctx, specs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-objects.Synced():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}

	other, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	id := other.ClusterID()
	member := peering.Member{ClusterID: id, PublicKey: other.Public(), Gossip: "198.18.0.2:7946", Sources: []string{"seed"}, Alive: true}
	eng.MemberChanged(member)

	// The agent creates the Peer; the engine hears of its spec (generation
	// 1) and says so.
	peer := waitPeer(t, c, id, "the Peer created, generation 1 observed", func(p v1alpha1.Peer) error {
		if p.Status.ObservedGeneration != 1 || p.Status.Phase != v1alpha1.PhaseDiscovered {
			return fmt.Errorf("observed %d, phase %q", p.Status.ObservedGeneration, p.Status.Phase)
		}
		return nil
	})
	if peer.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue || peer.Status.Sources[0] != "seed" || peer.Status.Gossip != "198.18.0.2:7946" {
		t.Fatalf("Peer as created: labels %v, sources %v, gossip %q", peer.Labels, peer.Status.Sources, peer.Status.Gossip)
	}
	memberSince := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionMember).LastTransitionTime

	// The admin denies (generation 2), but the engine has not heard yet.
	specs.hold()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"networking":"Deny"}}`))
	if err := c.Patch(context.Background(), &peer, patch); err != nil {
		t.Fatal(err)
	}
	if peer.Generation != 2 {
		t.Fatalf("generation %d after the spec change, want 2", peer.Generation)
	}
	eventually.Within(t, 30*time.Second, "the informer saw generation 2", func() error {
		if g := specs.heldGeneration(); g != 2 {
			return fmt.Errorf("held generation %d", g)
		}
		return nil
	})
	// Something else changes meanwhile: the status is written again, and
	// still names generation 1, the spec the engine acts on.
	member.Gossip = "198.18.0.3:7946"
	eng.MemberChanged(member)
	peer = waitPeer(t, c, id, "the new gossip address written", func(p v1alpha1.Peer) error {
		if p.Status.Gossip != member.Gossip {
			return fmt.Errorf("gossip %q", p.Status.Gossip)
		}
		return nil
	})
	if peer.Status.ObservedGeneration != 1 || peer.Status.Phase == v1alpha1.PhaseDenied {
		t.Fatalf("before the engine acted on generation 2: observed %d, phase %s", peer.Status.ObservedGeneration, peer.Status.Phase)
	}
	if got := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionMember).LastTransitionTime; !got.Equal(&memberSince) {
		t.Fatalf("Member's transition time moved from %v to %v without a transition", memberSince, got)
	}

	// The engine acts on it.
	specs.release()
	waitPeer(t, c, id, "generation 2 observed", func(p v1alpha1.Peer) error {
		accepted := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionAccepted)
		if p.Status.ObservedGeneration != 2 || p.Status.Phase != v1alpha1.PhaseDenied || accepted.Reason != "DeniedHere" || accepted.ObservedGeneration != 2 {
			return fmt.Errorf("observed %d, phase %s, Accepted %+v", p.Status.ObservedGeneration, p.Status.Phase, accepted)
		}
		return nil
	})

	// Deleting the Peer resets the peering; the agent creates it again.
	if err := c.Delete(context.Background(), &peer); err != nil {
		t.Fatal(err)
	}
	waitPeer(t, c, id, "the Peer recreated", func(p v1alpha1.Peer) error {
		if p.UID == peer.UID {
			return errors.New("still the deleted object")
		}
		if p.Status.Phase != v1alpha1.PhaseDiscovered || p.Status.ObservedGeneration != 1 {
			return fmt.Errorf("phase %q, observed %d", p.Status.Phase, p.Status.ObservedGeneration)
		}
		return nil
	})
	eventually.Within(t, 30*time.Second, "the writer holds nothing once written", func() error {
		if n := objects.status.entries(); n != 0 {
			return fmt.Errorf("%d peers held", n)
		}
		return nil
	})
}

// gate passes specs to the engine, or holds them while told to.
type gate struct {
	eng  *peering.Engine
	mu   sync.Mutex
	held []func()
	gen  int64
	on   bool
}

func (g *gate) SpecChanged(id string, s peering.Spec) {
	g.pass(func() { g.eng.SpecChanged(id, s) }, s.Generation)
}

func (g *gate) SpecDeleted(id string) { g.pass(func() { g.eng.SpecDeleted(id) }, 0) }

func (g *gate) pass(f func(), gen int64) {
	g.mu.Lock()
	if g.on {
		g.held, g.gen = append(g.held, f), gen
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	f()
}

func (g *gate) hold() { g.mu.Lock(); g.on = true; g.mu.Unlock() }

func (g *gate) heldGeneration() int64 { g.mu.Lock(); defer g.mu.Unlock(); return g.gen }

func (g *gate) release() {
	g.mu.Lock()
	held := g.held
	g.held, g.on = nil, false
	g.mu.Unlock()
	for _, f := range held {
		f()
	}
}

func waitPeer(t *testing.T, c client.Reader, id, what string, ok func(v1alpha1.Peer) error) v1alpha1.Peer {
	t.Helper()
	var p v1alpha1.Peer
	eventually.Within(t, 30*time.Second, what, func() error {
		p = v1alpha1.Peer{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: id}, &p); err != nil {
			return err
		}
		return ok(p)
	})
	return p
}

// startEngine runs an engine with a real ledger, a data path that does
// nothing and a transport that loses everything: enough to be a member
// that never answers.
func startEngine(t *testing.T, pub peering.Publisher, log *slog.Logger) *peering.Engine {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := ipam.Open(filepath.Join(t.TempDir(), ipam.FileName), ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := tunnel.GeneratePrivateKey()
	eng, err := peering.New(peering.Config{
		Identity: id, Name: "here", Networks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
		Endpoint: netip.MustParseAddrPort("198.18.1.1:51820"),
		Ledger:   ledger, Dataplane: idleDataplane{key.PublicKey()}, Transport: lossyTransport{}, Publisher: pub,
		Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); eng.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; ledger.Close() })
	<-eng.Ready()
	return eng
}

type idleDataplane struct{ key tunnel.Key }

func (idleDataplane) Apply(context.Context, tunnel.Desired) error { return nil }
func (idleDataplane) Status() ([]tunnel.PeerStatus, error)        { return nil, nil }
func (d idleDataplane) PublicKey() tunnel.Key                     { return d.key }

type lossyTransport struct{}

func (lossyTransport) Send(context.Context, string, []byte) error { return nil }

// installCRDs applies the embedded CRDs, as the agent does at start.
// apiServer starts an API server with the CRDs for the test, and returns
// its configuration and a client of its own.
func apiServer(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp1", harness.ControlPlaneOptions{})
	installCRDs(t, cp.Config)
	c, err := client.New(cp.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cp.Config, c
}

func installCRDs(t *testing.T, cfg *rest.Config) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(deploy.CRDs, "crds/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		raw, err := fs.ReadFile(deploy.CRDs, f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := c.Create(context.Background(), &crd); err != nil {
			t.Fatalf("create CRD %s: %v", crd.Name, err)
		}
		eventually.Within(t, 30*time.Second, "CRD "+crd.Name+" established", func() error {
			var got apiextensionsv1.CustomResourceDefinition
			if err := c.Get(context.Background(), client.ObjectKey{Name: crd.Name}, &got); err != nil {
				return err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
			return errors.New("not established")
		})
	}
}
