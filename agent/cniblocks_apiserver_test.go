package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// theirNetworks are the ranges of o that c's Peer of o lists, sorted.
func theirNetworks(c, o *federation.Cluster) ([]string, error) {
	peers, err := c.Peers(context.Background())
	if err != nil {
		return nil, err
	}
	p, ok := peers[o.Name]
	if !ok {
		return nil, fmt.Errorf("%s has no Peer for %s", c.Name, o.Name)
	}
	var out []string
	for _, n := range p.Status.TheirNetworks {
		out = append(out, n.Range)
	}
	slices.Sort(out)
	return out, nil
}

// A cluster on a /8 whose CNI allocates addresses itself (no Node has
// spec.podCIDRs) announces the blocks the CNI recorded, not the /8:
// Calico's confirmed BlockAffinities on a, a CiliumNode's pod CIDRs on c.
// b, on a /16 inside a's /8, connects (a remaps it) and every pod talks.
// Blocks that come, are confirmed or go are announced anew; a claim not
// confirmed never is.
func TestAnnounceTheCNIsBlocks(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{
		PodCIDRs: []string{"10.0.0.0/8", "10.244.0.0/16", "192.168.0.0/16"},
		ArgsFor: func(i int, _ []*federation.Cluster) []string {
			if i == 2 {
				return []string{"--announce", "blocks"}
			}
			return nil
		},
	})
	a, b, c := cs[0], cs[1], cs[2]
	ctx := context.Background()
	crds := os.DirFS("testdata/cni-crds")
	if err := harness.ApplyCRDs(ctx, a.CP.Config, crds, "crd.projectcalico.org_*.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := harness.ApplyCRDs(ctx, c.CP.Config, crds, "cilium.io_*.yaml"); err != nil {
		t.Fatal(err)
	}
	// As Calico's IPAM writes them: one confirmed block per node, and a
	// claim under way.
	affinities := resource(t, a, calicoBlockAffinities)
	affinity := func(node, cidr, state string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
			"metadata": map[string]any{"name": node + "-" + strings.NewReplacer(".", "-", "/", "-").Replace(cidr)},
			"spec":     map[string]any{"cidr": cidr, "node": node, "state": state, "deleted": "false"},
		}}
	}
	for _, o := range []*unstructured.Unstructured{
		affinity("gw", "10.0.0.0/26", "confirmed"),
		affinity("w1", "10.0.1.0/26", "confirmed"),
		affinity("w2", "10.0.2.0/26", "pending"),
	} {
		if _, err := affinities.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ciliumNode := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
		"metadata": map[string]any{"name": "gw"},
		"spec":     map[string]any{"ipam": map[string]any{"podCIDRs": []any{"192.168.0.0/24", "fd00:c::/96"}}},
	}}
	if _, err := resource(t, c, ciliumNodes).Create(ctx, ciliumNode, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(federation.Diagnose(cs))
		}
	})
	federation.Connect(t, cs)

	announces := func(c, o *federation.Cluster, want ...string) func() error {
		return func() error {
			got, err := theirNetworks(c, o)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s's Peer of %s lists %v", c.Name, o.Name, got)
			}
			return nil
		}
	}
	for _, o := range []*federation.Cluster{b, c} {
		// Not the /8, nor the claim still pending.
		if err := announces(o, a, "10.0.0.0/26", "10.0.1.0/26")(); err != nil {
			t.Errorf("a's confirmed block affinities: %v", err)
		}
	}
	for _, o := range []*federation.Cluster{a, b} {
		if err := announces(o, c, "192.168.0.0/24")(); err != nil {
			t.Errorf("c's CiliumNode pod CIDRs: %v", err)
		}
	}
	federation.AllPairsTalk(t, cs)

	// A claim under way for w3, then w2's confirmed: once w2's block is
	// announced, the informer has seen w3's claim too, and left it out.
	if _, err := affinities.Create(ctx, affinity("w3", "10.0.3.0/26", "pending"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	confirmed := affinity("w2", "10.0.2.0/26", "confirmed")
	if got, err := affinities.Get(ctx, confirmed.GetName(), metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else {
		confirmed.SetResourceVersion(got.GetResourceVersion())
	}
	if _, err := affinities.Update(ctx, confirmed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b sees a's block confirmed for w2, and not w3's pending one", announces(b, a, "10.0.0.0/26", "10.0.1.0/26", "10.0.2.0/26"))
	// A block released by its node is no longer announced.
	if err := affinities.Delete(ctx, affinity("w1", "10.0.1.0/26", "").GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b no longer sees w1's block of a", announces(b, a, "10.0.0.0/26", "10.0.2.0/26"))
	federation.AllPairsTalk(t, cs)
}

// resource is a dynamic client of gvr on c's API server.
func resource(t *testing.T, c *federation.Cluster, gvr schema.GroupVersionResource) dynamic.ResourceInterface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn.Resource(gvr)
}
