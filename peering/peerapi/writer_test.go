package peerapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The client that writes statuses allows the writer's own rate, whatever
// the agent's config says: client-go's default would throttle a start-up's
// writes to 5 requests a second.
func TestWriteClientAllowsTheWritersRate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  *rest.Config
	}{
		{"client-go's defaults", &rest.Config{Host: "https://127.0.0.1:6443"}},
		{"a lower rate", &rest.Config{Host: "https://127.0.0.1:6443", QPS: 1, Burst: 2}},
		{"a limiter of its own", &rest.Config{Host: "https://127.0.0.1:6443", RateLimiter: flowcontrol.NewTokenBucketRateLimiter(1, 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := *tc.cfg
			got := writeClientConfig(tc.cfg)
			if got.RateLimiter != nil || got.QPS < writeRate*requestsPerWrite || got.Burst < writeBurst*requestsPerWrite {
				t.Errorf("QPS %v, burst %d, limiter %v: want at least %d and %d, no limiter of its own", got.QPS, got.Burst, got.RateLimiter, writeRate*requestsPerWrite, writeBurst*requestsPerWrite)
			}
			if tc.cfg.QPS != before.QPS || tc.cfg.Burst != before.Burst || tc.cfg.RateLimiter != before.RateLimiter {
				t.Errorf("the agent's config changed: %+v", tc.cfg)
			}
		})
	}
}

// A peer discovered shortly before its statement arrives gets its object
// in one creation, labelled with its name, and its first status already
// holds its view: two requests, not four in a row (create, status, label,
// status) before a person or a program finds the view. (A peer that never
// speaks still gets its object after the wait: TestPeerObjects.)
func TestNewPeerIsWrittenWithItsStatement(t *testing.T) {
	objects, c, requests := recordedObjects(t)
	objects.status.unnamedWait = time.Hour // the statement always comes first here
	runObjects(t, objects)

	named := sampleState()
	named.Phase = peering.PhaseNegotiating
	objects.Publish(peering.PeerState{ClusterID: named.ClusterID, Phase: peering.PhaseDiscovered, Gossip: named.Gossip})
	// The witness that the writer had its chance at the first state: the
	// state of another peer, published with it, is written.
	other := sampleState()
	other.ClusterID = "cbk6b5nxt5mbvd6ta2xmlvy3ixy"
	objects.Publish(other)
	waitPeer(t, c, other.ClusterID, "the other peer written", func(v1alpha1.Peer) error { return nil })
	objects.Publish(named)
	peer := waitPeer(t, c, named.ClusterID, "the view written", func(p v1alpha1.Peer) error {
		if len(p.Status.TheirNetworks) == 0 {
			return fmt.Errorf("status %+v", p.Status)
		}
		return nil
	})
	if peer.Labels[v1alpha1.LabelClusterName] != named.Name {
		t.Errorf("labels %v, want %s=%s", peer.Labels, v1alpha1.LabelClusterName, named.Name)
	}
	var mine []string
	for _, r := range requests() {
		if !strings.HasPrefix(r, http.MethodGet) && strings.Contains(r, named.ClusterID) {
			mine = append(mine, r)
		}
	}
	if len(mine) != 2 {
		t.Fatalf("writes before the view showed: %v, want the object's creation and one status", mine)
	}
}

// Neither the informer nor the writer asks the API server what it serves
// before their first request: two round trips each on an agent's way to
// gossip and to its first status.
func TestPeersNeedNoDiscovery(t *testing.T) {
	objects, c, requests := recordedObjects(t)
	runObjects(t, objects)
	s := sampleState()
	objects.Publish(s)
	waitPeer(t, c, s.ClusterID, "the status written", func(p v1alpha1.Peer) error {
		if p.Status.Phase == "" {
			return errors.New("no status yet")
		}
		return nil
	})
	for _, r := range requests() {
		switch strings.TrimPrefix(r, "GET ") {
		case "/api", "/apis", "/apis/" + v1alpha1.GroupVersion.String():
			t.Errorf("discovery request %s", r)
		}
	}
}

// recordedObjects is New against a new API server with the CRDs, and the
// requests made through it, as "METHOD path"; c is a client of its own.
func recordedObjects(t *testing.T) (objects *Objects, c client.Client, requests func() []string) {
	t.Helper()
	server, c := apiServer(t)
	cfg, recorded := harness.RecordRequests(server, nil)
	objects, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return objects, c, recorded.All
}

// runObjects runs objects until the test ends, and waits for its informer.
func runObjects(t *testing.T, objects *Objects) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- objects.Run(ctx, noSpecs{}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	<-objects.Synced()
}

type noSpecs struct{}

func (noSpecs) SpecChanged(string, peering.Spec) {}
func (noSpecs) SpecDeleted(string)               {}

// The Peer of a member gone for good goes once the engine retires it,
// unless an admin decided something in its spec: that Peer stays.
func TestRetiredPeerIsDeletedUnlessTheAdminDecided(t *testing.T) {
	objects, c, _ := recordedObjects(t)
	runObjects(t, objects)
	old, decided, by := sampleState(), sampleState(), sampleState()
	decided.ClusterID = "cbk6b5nxt5mbvd6ta2xmlvy3ixy"
	by.ClusterID = "cxqjv3m6dcm5yq2xcyyqgmlq3aa"
	for _, s := range []peering.PeerState{old, decided, by} {
		objects.Publish(s)
		waitPeer(t, c, s.ClusterID, "the status written", func(p v1alpha1.Peer) error {
			if p.Status.Phase == "" {
				return errors.New("no status yet")
			}
			return nil
		})
	}
	var p v1alpha1.Peer
	if err := c.Get(context.Background(), client.ObjectKey{Name: decided.ClusterID}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Networking = v1alpha1.NetworkingAccept
	if err := c.Update(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	// The informer must have seen the admin's spec before the writer acts.
	eventually.Within(t, 30*time.Second, "the spec in the writer's cache", func() error {
		var cached v1alpha1.Peer
		if err := objects.Reader().Get(context.Background(), client.ObjectKey{Name: decided.ClusterID}, &cached); err != nil {
			return err
		}
		if cached.Spec.Networking != v1alpha1.NetworkingAccept {
			return fmt.Errorf("spec %+v", cached.Spec)
		}
		return nil
	})

	objects.Retire(decided.ClusterID, "cluster east is back as "+by.ClusterID)
	objects.Retire(old.ClusterID, "cluster east is back as "+by.ClusterID)
	eventually.Within(t, 30*time.Second, "the retired Peer deleted", func() error {
		err := c.Get(context.Background(), client.ObjectKey{Name: old.ClusterID}, &v1alpha1.Peer{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	// Retirements are handled in order per writer queue, but not
	// across peers: the witness that the decided one was handled too is
	// its queue entry gone.
	eventually.Within(t, 30*time.Second, "the decided Peer's request handled", func() error {
		if n := objects.status.entries(); n != 0 {
			return fmt.Errorf("%d entries queued", n)
		}
		return nil
	})
	for _, id := range []string{decided.ClusterID, by.ClusterID} {
		if err := c.Get(context.Background(), client.ObjectKey{Name: id}, &v1alpha1.Peer{}); err != nil {
			t.Errorf("Peer %s: %v, want it kept", id, err)
		}
	}
}

// The states that follow a Peer's creation are one request each while the
// informer has not shown the object yet (a watch event behind on a loaded
// API server): the writer's own creation stands in for it, instead of a
// second creation in front of each status. A Peer deleted meanwhile is
// created again with the next state at once.
func TestStatesAfterCreationAreOneRequestEach(t *testing.T) {
	server, c := apiServer(t)
	cfg, writes := harness.RecordRequests(server, harness.Writes)
	wc, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := newStatusWriter(wc, laggingCache{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the writer stopped with %v", err)
		}
	})

	s := sampleState()
	for i, ph := range []peering.Phase{peering.PhaseNegotiating, peering.PhaseDegraded, peering.PhaseConnected} {
		s.Phase = ph
		w.publish(s)
		waitPeer(t, c, s.ClusterID, fmt.Sprintf("state %d written", i), func(p v1alpha1.Peer) error {
			if p.Status.Phase != v1alpha1.Phase(ph) {
				return fmt.Errorf("phase %q", p.Status.Phase)
			}
			return nil
		})
	}
	got := writes.All()
	status := "/apis/" + v1alpha1.GroupVersion.String() + "/peers/" + s.ClusterID + "/status"
	want := []string{http.MethodPatch + " /apis/" + v1alpha1.GroupVersion.String() + "/peers/" + s.ClusterID,
		http.MethodPatch + " " + status, http.MethodPatch + " " + status, http.MethodPatch + " " + status}
	if !slices.Equal(got, want) {
		t.Fatalf("writes %v, want one creation and three statuses %v", got, want)
	}

	old := waitPeer(t, c, s.ClusterID, "the Peer", func(v1alpha1.Peer) error { return nil })
	if err := c.Delete(context.Background(), &old); err != nil {
		t.Fatal(err)
	}
	s.Phase = peering.PhaseNegotiating
	w.publish(s)
	waitPeer(t, c, s.ClusterID, "the Peer created again with the next state", func(p v1alpha1.Peer) error {
		if p.UID == old.UID {
			return errors.New("still the deleted object")
		}
		if p.Status.Phase != v1alpha1.Phase(s.Phase) || p.Labels[v1alpha1.LabelClusterName] != s.Name {
			return fmt.Errorf("phase %q, labels %v", p.Status.Phase, p.Labels)
		}
		return nil
	})
}

// laggingCache is an informer that has not seen any Peer yet.
type laggingCache struct{ client.Reader }

func (laggingCache) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("peers").GroupResource(), key.Name)
}

// A condition's transition time is when the writer changed it, even while
// its cache shows an older copy of the Peer (a watch behind on a loaded
// API server): read from that copy, the Member condition would look
// changed again at each write, and its time would move.
func TestTransitionTimesSurviveAStaleCache(t *testing.T) {
	_, c := apiServer(t)
	stale := &staleCache{}
	w, err := newStatusWriter(c, stale, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	w.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	tick := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Minute)
		return clock
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the writer stopped with %v", err)
		}
	})
	member := func(p v1alpha1.Peer) *metav1.Condition {
		return meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionMember)
	}

	s := sampleState()
	s.Phase, s.Member = peering.PhaseUnreachable, peering.Condition{Reason: "Suspect", Message: "not answering"}
	w.publish(s)
	first := waitPeer(t, c, s.ClusterID, "Member False written", func(p v1alpha1.Peer) error {
		if m := member(p); m == nil || m.Status != metav1.ConditionFalse {
			return fmt.Errorf("Member %+v", m)
		}
		return nil
	})
	// From now on the cache shows only that first copy.
	stale.set(first)

	back := tick()
	s.Phase, s.Member = peering.PhaseConnected, peering.Condition{OK: true, Reason: "Alive", Message: "alive member of the federation"}
	w.publish(s)
	waitPeer(t, c, s.ClusterID, "Member True written", func(p v1alpha1.Peer) error {
		if m := member(p); m == nil || m.Status != metav1.ConditionTrue || !m.LastTransitionTime.Time.Equal(back) {
			return fmt.Errorf("Member %+v, want True since %s", m, back)
		}
		return nil
	})
	for i := range 3 {
		tick()
		s.StatementGeneration++ // another write, Member unchanged
		w.publish(s)
		want := int64(s.StatementGeneration & (1<<63 - 1))
		p := waitPeer(t, c, s.ClusterID, fmt.Sprintf("write %d", i), func(p v1alpha1.Peer) error {
			if p.Status.StatementGeneration != want {
				return fmt.Errorf("statement generation %d, want %d", p.Status.StatementGeneration, want)
			}
			return nil
		})
		if m := member(p); m == nil || !m.LastTransitionTime.Time.Equal(back) {
			t.Fatalf("write %d: Member %+v, want True since %s: its time moved", i, m, back)
		}
	}
}

// staleCache is an informer stuck on one copy of one Peer.
type staleCache struct {
	client.Reader
	mu   sync.Mutex
	peer *v1alpha1.Peer
}

func (c *staleCache) set(p v1alpha1.Peer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peer = p.DeepCopy()
}

func (c *staleCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peer == nil || c.peer.Name != key.Name {
		return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("peers").GroupResource(), key.Name)
	}
	c.peer.DeepCopyInto(obj.(*v1alpha1.Peer))
	return nil
}
