package peerapi

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// A peer's cluster labels are shown in its Peer's status, never as the
// Peer's labels (which select providers: the local admin's alone). A
// label the local admin adds stays; an announced one that goes or
// changes follows in the status; and a write whose labels did not change
// is only the status.
func TestPeerLabelsFollowTheStatement(t *testing.T) {
	objects, c, requests := recordedObjects(t)
	runObjects(t, objects)
	s := sampleState()
	s.Labels = map[string]string{"region": "a", "topology.example.com/zone": "a1"}
	objects.Publish(s)
	ours := func(map[string]string) map[string]string {
		return map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, v1alpha1.LabelClusterName: s.Name}
	}
	announced := func(want map[string]string) func(v1alpha1.Peer) error {
		return func(p v1alpha1.Peer) error {
			if !maps.Equal(p.Status.AnnouncedLabels, want) {
				return fmt.Errorf("announced labels %v, want %v", p.Status.AnnouncedLabels, want)
			}
			return nil
		}
	}
	waitPeer(t, c, s.ClusterID, "the peer's labels in its Peer's status", announced(s.Labels))
	peer := waitPeer(t, c, s.ClusterID, "none of them as the Peer's labels", labelsAre(ours(s.Labels)))

	// The admin adds a label of their own, as kubectl label does.
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"team":"infra"}}}`))
	if err := c.Patch(context.Background(), &peer, patch, client.FieldOwner("kubectl-label")); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		what      string
		announced map[string]string
	}{
		{"a label no longer announced goes", map[string]string{"region": "a"}},
		{"a changed value follows", map[string]string{"region": "b"}},
	} {
		s.Labels = step.announced
		s.StatementGeneration++
		objects.Publish(s)
		want := ours(s.Labels)
		want["team"] = "infra"
		waitPeer(t, c, s.ClusterID, step.what+", the admin's label kept, the status written", func(p v1alpha1.Peer) error {
			if p.Status.StatementGeneration != int64(s.StatementGeneration) {
				return fmt.Errorf("status of statement %d", p.Status.StatementGeneration)
			}
			if err := announced(s.Labels)(p); err != nil {
				return err
			}
			return labelsAre(want)(p)
		})
	}
	want := ours(s.Labels)
	want["team"] = "infra"

	// Unchanged labels: the next write is the status alone. The cache
	// shows the labels first, or a write would rightly apply them again.
	waitPeer(t, objects.Reader(), s.ClusterID, "the cache up to date", labelsAre(want))
	before := len(requests())
	s.Gossip = "198.18.1.9:7946"
	objects.Publish(s)
	waitPeer(t, c, s.ClusterID, "the new gossip address written", func(p v1alpha1.Peer) error {
		if p.Status.Gossip != s.Gossip {
			return fmt.Errorf("gossip %q", p.Status.Gossip)
		}
		return nil
	})
	var writes []string
	for _, r := range requests()[before:] {
		if !strings.HasPrefix(r, http.MethodGet) && strings.Contains(r, s.ClusterID) {
			writes = append(writes, r)
		}
	}
	if len(writes) != 1 || !strings.HasSuffix(writes[0], "/status") {
		t.Fatalf("writes with the labels unchanged: %v, want the status alone", writes)
	}
}

func labelsAre(want map[string]string) func(v1alpha1.Peer) error {
	return func(p v1alpha1.Peer) error {
		if !maps.Equal(p.Labels, want) {
			return fmt.Errorf("labels %v, want %v", p.Labels, want)
		}
		return nil
	}
}
