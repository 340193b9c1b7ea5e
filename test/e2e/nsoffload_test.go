package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Namespace offloading across three clusters of real nodes, the agents as
// pods under their own accounts: a consumer (a) and two providers that
// grant every peer (--offload-grants=auto), b announcing region=a by its
// own --cluster-label, which a's admin takes as its label of b's Peer,
// and c, whose agent joins the federation only once the namespace is
// offloaded. A namespace offloaded with a selector reaches the matching
// provider; c joining and announcing region=a is not selected by what it
// says of itself, only once a's admin labels its Peer, and leaves when
// the admin takes the label off; a name that exists on a provider, or a
// reserved one, is refused with its reason and nothing of the provider's
// is touched; restarting an agent mid-way converges; deleting the
// NamespaceOffload removes the remote namespaces, then itself.
func TestNamespaceOffload(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 3, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		ArgsFor: func(i int) []string {
			if i == 1 {
				return []string{"--offload-grants=auto", "--cluster-label=region=a"}
			}
			return nil
		},
		Later: []int{2}, // c joins in a subtest
	})
	a, b, c := cs[0], cs[1], cs[2]
	federation.WaitPhases(t, federation.Clusters(cs[:2]), v1alpha1.PhaseConnected, 90*time.Second)
	acceptOffloading(t, a, b.Name, "region")
	waitCondition(t, a, b.Name, v1alpha1.ConditionOffloadCredential, "Ready", 60*time.Second)
	aID := peerID(t, b, a.Name)

	createNamespace(t, a, "shop")
	remote, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", aID)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the selector picks the provider labelled region=a", func(t *testing.T) {
		out, err := flotillaCLI(t, a, "offload", "namespace", "shop", "--selector", "region=a")
		if err != nil || !strings.Contains(out, "Ready") {
			t.Fatalf("flotilla offload namespace shop: %v\n%s", err, out)
		}
		nso := waitOffloadPhase(t, a, "shop", v1alpha1.OffloadReady, 30*time.Second)
		if len(nso.Status.Clusters) != 1 || nso.Status.Clusters[0].ClusterName != b.Name || nso.Status.Clusters[0].RemoteNamespace != remote {
			t.Errorf("status.clusters %+v, want only %s with namespace %s", nso.Status.Clusters, b.Name, remote)
		}
		ns := waitNamespace(t, b, remote, 30*time.Second)
		if ns.Labels[offload.LabelTenant] != aID || ns.Labels[v1alpha1.LabelMirroredFrom] != "shop" {
			t.Errorf("namespace %s on %s has labels %v", remote, b.Name, ns.Labels)
		}
	})

	t.Run("a cluster announcing region=a is not selected by it; the admin's label brings it in", func(t *testing.T) {
		c.InstallAgent(t, []string{"--offload-grants=auto", "--cluster-label=region=a"})
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
		acceptOffloading(t, a, c.Name) // offloading accepted, the label not taken
		waitCondition(t, a, c.Name, v1alpha1.ConditionOffloadCredential, "Ready", 60*time.Second)
		if p := peerNamed(t, a, c.Name); p.Status.AnnouncedLabels["region"] != "a" || p.Labels["region"] != "" {
			t.Fatalf("a's Peer for %s: announced %v, labels %v; want region=a announced only", c.Name, p.Status.AnnouncedLabels, p.Labels)
		}
		// The witness that a selected with c's Peer known: a new
		// generation of the same selection, acted on.
		setSelector(t, a, "shop", "region in (a)")
		nso := waitOffloadPhase(t, a, "shop", v1alpha1.OffloadReady, 30*time.Second)
		if len(nso.Status.Clusters) != 1 || nso.Status.Clusters[0].ClusterName != b.Name {
			t.Errorf("status.clusters %+v: the label %s announced selected it", nso.Status.Clusters, c.Name)
		}
		if _, err := c.CP.Client.CoreV1().Namespaces().Get(context.Background(), remote, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s on %s: %v, want none", remote, c.Name, err)
		}

		mustKubectl(t, a.CP, "label", "peer", peerID(t, a, c.Name), "region=a")
		waitOffloadClusters(t, a, "shop", []string{b.Name, c.Name}, 90*time.Second)
		ns := waitNamespace(t, c, remote, 30*time.Second)
		if ns.Labels[offload.LabelTenant] != aID || ns.Labels[v1alpha1.LabelMirroredFrom] != "shop" {
			t.Errorf("namespace %s on %s has labels %v", remote, c.Name, ns.Labels)
		}
		mustKubectl(t, a.CP, "label", "peer", peerID(t, a, c.Name), "region-")
		waitOffloadClusters(t, a, "shop", []string{b.Name}, 90*time.Second)
		waitNamespaceGone(t, c, remote, 60*time.Second)
		waitNamespace(t, b, remote, 5*time.Second)
	})

	t.Run("a label on c's Peer brings c in; taking it off takes c out", func(t *testing.T) {
		mustKubectl(t, a.CP, "label", "peer", peerID(t, a, c.Name), "region-extra=yes")
		setSelector(t, a, "shop", "region-extra=yes")
		waitOffloadPhase(t, a, "shop", v1alpha1.OffloadReady, 30*time.Second)
		waitNamespace(t, c, remote, 30*time.Second)
		waitNamespaceGone(t, b, remote, 60*time.Second)
		mustKubectl(t, a.CP, "label", "peer", peerID(t, a, c.Name), "region-extra-")
		waitOffloadPhase(t, a, "shop", v1alpha1.OffloadNoClusterSelected, 30*time.Second)
		waitNamespaceGone(t, c, remote, 60*time.Second)
		setSelector(t, a, "shop", "region=a")
		waitOffloadPhase(t, a, "shop", v1alpha1.OffloadReady, 30*time.Second)
	})

	t.Run("SameName against a namespace of the provider's: AlreadyExists, untouched", func(t *testing.T) {
		createNamespace(t, a, "dup")
		createNamespace(t, b, "dup")
		before := waitNamespace(t, b, "dup", 5*time.Second)
		out, err := flotillaCLI(t, a, "offload", "namespace", "dup", "--selector", "region=a", "--mapping", "SameName", "--wait", "20s")
		if err == nil || !strings.Contains(out, "AlreadyExists") {
			t.Errorf("flotilla offload namespace dup (SameName): %v, want AlreadyExists:\n%s", err, out)
		}
		nso := waitOffloadPhase(t, a, "dup", v1alpha1.OffloadAllFailed, 30*time.Second)
		if r := clusterReason(nso, b.Name); r != "AlreadyExists" {
			t.Errorf("dup on %s: %s, want AlreadyExists", b.Name, r)
		}
		after := waitNamespace(t, b, "dup", 5*time.Second)
		if after.ResourceVersion != before.ResourceVersion || after.Labels[offload.LabelTenant] != "" {
			t.Errorf("the provider's own namespace dup was touched: %v", after.ObjectMeta)
		}
	})

	t.Run("a reserved name is refused, nothing created", func(t *testing.T) {
		createNamespace(t, a, "sys")
		_, _ = flotillaCLI(t, a, "offload", "namespace", "sys", "--selector", "region=a", "--mapping", "Selected", "--remote-name", "kube-foo", "--wait", "20s")
		nso := waitOffloadPhase(t, a, "sys", v1alpha1.OffloadAllFailed, 30*time.Second)
		if r := clusterReason(nso, b.Name); r != "Reserved" {
			t.Errorf("kube-foo on %s: %s, want Reserved", b.Name, r)
		}
		if _, err := b.CP.Client.CoreV1().Namespaces().Get(context.Background(), "kube-foo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace kube-foo on %s: %v", b.Name, err)
		}
	})

	t.Run("agents restarted mid-way converge", func(t *testing.T) {
		createNamespace(t, a, "cart")
		cart, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "cart", "", aID)
		if err != nil {
			t.Fatal(err)
		}
		// Both agents go down, and the namespace is offloaded meanwhile.
		oldA, oldB := restartAgent(t, a), restartAgent(t, b)
		if out, err := flotillaCLI(t, a, "offload", "namespace", "cart", "--selector", "region=a", "--wait", "0"); err != nil {
			t.Fatalf("flotilla offload namespace cart: %v\n%s", err, out)
		}
		waitNewAgent(t, a, oldA)
		waitNewAgent(t, b, oldB)
		waitOffloadPhase(t, a, "cart", v1alpha1.OffloadReady, 90*time.Second)
		waitNamespace(t, b, cart, 30*time.Second)
		reqs := &v1alpha1.NamespaceRequestList{}
		if err := b.Client.List(context.Background(), reqs, client.InNamespace(offload.TenantNamespace(aID))); err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, r := range reqs.Items {
			seen[r.Spec.SourceNamespace]++
		}
		for src, n := range seen {
			if n != 1 {
				t.Errorf("%d requests on %s for %s, want 1", n, b.Name, src)
			}
		}
	})

	t.Run("deleting the NamespaceOffload removes the remote namespaces, then itself", func(t *testing.T) {
		out, err := flotillaCLI(t, a, "unoffload", "namespace", "shop")
		if err != nil {
			t.Fatalf("flotilla unoffload namespace shop: %v\n%s", err, out)
		}
		waitNamespaceGone(t, b, remote, 60*time.Second)
		var list v1alpha1.NamespaceOffloadList
		if err := a.Client.List(context.Background(), &list, client.InNamespace("shop")); err != nil || len(list.Items) != 0 {
			t.Errorf("NamespaceOffloads left in shop: %d (err %v)", len(list.Items), err)
		}
	})
}

func namespaceNamed(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// offloadedNamespace is namespace name labelled into the placement
// webhook, as the administrator's `flotilla offload namespace` labels it,
// for a fixture that writes its NamespaceOffload directly.
func offloadedNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{offload.LabelOffloaded: "true"}}}
}

func createNamespace(t *testing.T, c *federation.NodeCluster, name string) {
	t.Helper()
	_, err := c.CP.Client.CoreV1().Namespaces().Create(context.Background(), namespaceNamed(name), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s on %s: %v", name, c.Name, err)
	}
}

// waitNamespace waits until namespace name exists on c and returns it.
func waitNamespace(t *testing.T, c *federation.NodeCluster, name string, timeout time.Duration) corev1.Namespace {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ns, err := c.CP.Client.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			return *ns
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s on %s: %v after %s", name, c.Name, err, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitNamespaceGone(t *testing.T, c *federation.NodeCluster, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		_, err := c.CP.Client.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s still on %s after %s (err %v)", name, c.Name, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitOffloadClusters waits until the NamespaceOffload of ns on c is Ready
// with clusters, and no other, in its status.
func waitOffloadClusters(t testing.TB, c *federation.NodeCluster, ns string, clusters []string, timeout time.Duration) v1alpha1.NamespaceOffload {
	t.Helper()
	want := slices.Sorted(slices.Values(clusters))
	deadline := time.Now().Add(timeout)
	var last v1alpha1.NamespaceOffload
	for {
		err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "offload"}, &last)
		var got []string
		for _, cl := range last.Status.Clusters {
			got = append(got, cl.ClusterName)
		}
		slices.Sort(got)
		if err == nil && last.Status.Phase == v1alpha1.OffloadReady && last.Status.ObservedGeneration == last.Generation && slices.Equal(got, want) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("NamespaceOffload of %s on %s: phase %q (err %v), clusters %+v; want Ready with %v", ns, c.Name, last.Status.Phase, err, last.Status.Clusters, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitOffloadPhase waits until the NamespaceOffload of ns on c has phase
// want for the spec it holds.
func waitOffloadPhase(t testing.TB, c *federation.NodeCluster, ns string, want v1alpha1.OffloadPhase, timeout time.Duration) v1alpha1.NamespaceOffload {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last v1alpha1.NamespaceOffload
	for {
		err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "offload"}, &last)
		if err == nil && last.Status.Phase == want && last.Status.ObservedGeneration == last.Generation {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("NamespaceOffload of %s on %s: phase %q (err %v), clusters %+v; want %s", ns, c.Name, last.Status.Phase, err, last.Status.Clusters, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func clusterReason(nso v1alpha1.NamespaceOffload, cluster string) string {
	for _, cl := range nso.Status.Clusters {
		if cl.ClusterName == cluster {
			if c := meta.FindStatusCondition(cl.Conditions, "Ready"); c != nil {
				return c.Reason
			}
			return "no Ready condition"
		}
	}
	return fmt.Sprintf("not in status (%d clusters)", len(nso.Status.Clusters))
}

func setSelector(t *testing.T, c *federation.NodeCluster, ns, selector string) {
	t.Helper()
	if out, err := flotillaCLI(t, c, "offload", "namespace", ns, "--selector", selector, "--wait", "0"); err != nil {
		t.Fatalf("flotilla offload namespace %s --selector %s: %v\n%s", ns, selector, err, out)
	}
}

// restartAgent deletes c's agent pod, whose Deployment makes a new one,
// and returns the old pod's UID.
func restartAgent(t *testing.T, c *federation.NodeCluster) types.UID {
	t.Helper()
	pod, err := c.AgentPod(context.Background())
	if err != nil {
		t.Fatalf("agent pod of %s: %v", c.Name, err)
	}
	mustKubectl(t, c.CP, "-n", federation.AgentNamespace, "delete", "pod", pod.Name, "--wait=false")
	return pod.UID
}

// waitNewAgent waits until c's agent pod is another than old, and Ready.
func waitNewAgent(t *testing.T, c *federation.NodeCluster, old types.UID) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		pod, err := c.AgentPod(context.Background())
		if err == nil && pod.UID != old && federation.PodReady(pod) == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new Ready agent pod on %s after 90 s (err %v)", c.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
