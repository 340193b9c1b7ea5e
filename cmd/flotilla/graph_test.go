package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/observe/graph"
	"github.com/flotilla-io/flotilla/test/harness"
)

const (
	alphaID = "1a1a1a1a-0000-4000-8000-000000000001"
	betaID  = "2b2b2b2b-0000-4000-8000-000000000002"
)

// member is what one cluster of the test federation holds: its ID, its
// Nodes, and its Peer for the other.
type member struct {
	id    string
	nodes int
	peer  v1alpha1.Peer
}

// seed writes a member's objects into a real API server, as its agent
// would have.
func seed(t *testing.T, cp *harness.ControlPlane, m member) client.Client {
	t.Helper()
	ctx := t.Context()
	if err := harness.ApplyCRDs(ctx, cp.Config, deploy.CRDs, "crds/*.yaml"); err != nil {
		t.Fatal(err)
	}
	c, err := graphClient(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	prop := &aboutv1alpha1.ClusterProperty{ObjectMeta: metav1.ObjectMeta{Name: "cluster.clusterset.k8s.io"}, Spec: aboutv1alpha1.ClusterPropertySpec{Value: m.id}}
	if err := c.Create(ctx, prop); err != nil {
		t.Fatal(err)
	}
	for i := range m.nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + string(rune('a'+i))}}
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A provider's virtual node is not one of the cluster's.
	vn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-virtual", Labels: map[string]string{v1alpha1.LabelVirtualNode: "true"}}}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, vn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := m.peer.DeepCopy()
	status := p.Status
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status = status
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return c
}

func handshake(ago time.Duration) *metav1.Time {
	t := metav1.NewTime(time.Now().Add(-ago).Truncate(time.Second))
	return &t
}

// twoMembers is alpha and beta, peered: beta's pods overlap alpha's and
// are remapped; beta hosts alpha, which offloads namespace shop there.
func twoMembers() (alpha, beta member) {
	alpha = member{id: alphaID, nodes: 2, peer: v1alpha1.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: betaID},
		Status: v1alpha1.PeerStatus{
			ClusterName: "beta", Phase: v1alpha1.PhaseConnected, Endpoint: "192.0.2.2:51820", LastHandshake: handshake(20 * time.Second),
			TheirNetworks: []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.201.0.0/16"}},
			MyNetworks:    []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.101.0.0/16"}},
			Offloading:    &v1alpha1.OffloadingStatus{Received: &v1alpha1.GrantStatus{Namespace: "flotilla-tenant-alpha"}},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionOffloadCredential, Status: metav1.ConditionTrue, Reason: "CredentialValid",
				Message: "ok", LastTransitionTime: metav1.Now()}},
		},
	}}
	beta = member{id: betaID, nodes: 3, peer: v1alpha1.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: alphaID},
		Spec:       v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant},
		Status: v1alpha1.PeerStatus{
			ClusterName: "alpha", Phase: v1alpha1.PhaseDegraded, Endpoint: "192.0.2.1:51820", LastHandshake: handshake(10 * time.Minute),
			TheirNetworks: []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.101.0.0/16"}},
			MyNetworks:    []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.201.0.0/16"}},
			Offloading:    &v1alpha1.OffloadingStatus{Granted: &v1alpha1.GrantStatus{Namespace: "flotilla-tenant-alpha"}},
		},
	}}
	return alpha, beta
}

func graphOf(t *testing.T, args ...string) (g graph.Graph, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"graph", "--format", "json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("flotilla graph exited %d: %s", code, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), &g); err != nil {
		t.Fatalf("flotilla graph --format json: %v\n%s", err, out.String())
	}
	return g, errb.String()
}

// Two clusters' kubeconfigs: each one's report of itself and of the other
// meet in one graph, the link with both sides' views.
func TestGraphMergesClusters(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cps := env.ControlPlanes(2, harness.ControlPlaneOptions{})
	alpha, beta := twoMembers()
	ac := seed(t, cps[0], alpha)
	seed(t, cps[1], beta)
	ctx := context.Background()
	if _, err := cps[0].Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	no := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Name: "offload", Namespace: "shop"}}
	if err := ac.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	no.Status = v1alpha1.NamespaceOffloadStatus{Phase: v1alpha1.OffloadReady, Clusters: []v1alpha1.ClusterOffload{{ClusterID: betaID, ClusterName: "beta", RemoteNamespace: "shop-1a1a1a"}}}
	if err := ac.Status().Update(ctx, no); err != nil {
		t.Fatal(err)
	}

	g, stderr := graphOf(t, "--kubeconfig", cps[0].Kubeconfig, "--kubeconfig", cps[1].Kubeconfig)
	if len(g.Clusters) != 2 || len(g.Links) != 1 {
		t.Fatalf("%d clusters and %d links, want 2 and 1: %+v", len(g.Clusters), len(g.Links), g)
	}
	a, b := g.Clusters[0], g.Clusters[1]
	if a.ID != alphaID || a.Name != "alpha" || !a.Reported || a.Nodes == nil || *a.Nodes != 2 {
		t.Errorf("alpha = %+v, want its ID, its name as beta knows it, reported, 2 nodes", a)
	}
	if b.ID != betaID || b.Name != "beta" || !b.Reported || b.Nodes == nil || *b.Nodes != 3 {
		t.Errorf("beta = %+v, want its ID, its name as alpha knows it, reported, 3 nodes", b)
	}
	if len(a.Offloads) != 1 || a.Offloads[0].Namespace != "shop" || len(a.Offloads[0].Providers) != 1 || a.Offloads[0].Providers[0].ClusterID != betaID {
		t.Errorf("alpha's offloaded namespaces = %+v, want shop on beta", a.Offloads)
	}
	l := g.Links[0]
	if l.AB == nil || l.AB.Phase != "Connected" || graph.Ranges(l.AB.Theirs) != "10.1.0.0/16→10.201.0.0/16" || l.AB.OffloadsTo == nil || l.AB.OffloadsTo.State != "CredentialValid" {
		t.Errorf("alpha's side = %+v, want Connected, beta's pods as 10.201.0.0/16, offloading to beta with a valid credential", l.AB)
	}
	if l.BA == nil || l.BA.Phase != "Degraded" || l.BA.Hosts == nil || l.BA.Hosts.Namespace != "flotilla-tenant-alpha" || l.BA.Offloading != "Grant" {
		t.Errorf("beta's side = %+v, want Degraded, hosting alpha in flotilla-tenant-alpha by Grant", l.BA)
	}
	if l.AB != nil && (l.AB.HandshakeAgeSeconds == nil || *l.AB.HandshakeAgeSeconds < 20) {
		t.Errorf("alpha's handshake age = %v, want 20s or more", l.AB.HandshakeAgeSeconds)
	}
	// No agent runs in these clusters: the graph says what it left out.
	if !strings.Contains(stderr, "traffic not shown") {
		t.Errorf("stderr %q does not say the traffic counters were not read", stderr)
	}
}

// One cluster alone: its peer is drawn from what its Peer says.
func TestGraphOneCluster(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("alpha", harness.ControlPlaneOptions{})
	alpha, _ := twoMembers()
	seed(t, cp, alpha)

	var out, errb bytes.Buffer
	if code := run([]string{"graph", "--format", "svg", "--kubeconfig", cp.Kubeconfig}, &out, &errb); code != 0 {
		t.Fatalf("flotilla graph --format svg exited %d: %s", code, errb.String())
	}
	for _, want := range []string{`data-id="` + alphaID + `"`, `data-id="` + betaID + `"`, ">beta<", `data-a="` + alphaID + `" data-b="` + betaID + `"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the SVG has no %s:\n%s", want, out.String())
		}
	}
	g, _ := graphOf(t, "--kubeconfig", cp.Kubeconfig)
	var dot, errb2 bytes.Buffer
	if code := run([]string{"graph", "-o", "dot", "--kubeconfig", cp.Kubeconfig}, &dot, &errb2); code != 0 || !strings.HasPrefix(dot.String(), "graph federation {") ||
		!strings.Contains(dot.String(), `"`+alphaID+`" -- "`+betaID+`"`) {
		t.Errorf("flotilla graph -o dot exited %d (%s):\n%s", code, errb2.String(), dot.String())
	}
	if beta, ok := g.Cluster(betaID); !ok || beta.Reported || len(beta.PodCIDRs) != 1 || beta.PodCIDRs[0] != "10.1.0.0/16" {
		t.Errorf("beta = %+v, want unreported with the pods alpha's Peer names", beta)
	}
}

func TestGraphRefusesUnknownFormat(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"graph", "--format", "png"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "want dot, svg or json") {
		t.Errorf("exit %d, stderr %q: want 2 and the formats there are", code, errb.String())
	}
}

// A cluster without Flotilla: the error says so, and nothing is drawn.
func TestGraphWithoutFlotilla(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("bare", harness.ControlPlaneOptions{})
	var out, errb bytes.Buffer
	code := run([]string{"graph", "--kubeconfig", cp.Kubeconfig}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "Flotilla is not installed") || out.Len() != 0 {
		t.Errorf("exit %d, stdout %q, stderr %q: want 1, nothing drawn, and that Flotilla is not installed", code, out.String(), errb.String())
	}
}
