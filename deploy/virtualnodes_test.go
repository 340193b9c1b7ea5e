package deploy

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-io/flotilla/offload"
)

// virtualNodeLabels are the labels every virtual node and its Lease
// carry.
func virtualNodeLabels() map[string]string {
	return map[string]string{offload.LabelVirtualNode: "true", "app.kubernetes.io/managed-by": "flotilla"}
}

// virtualNodeSpec carries a virtual node's taint.
func virtualNodeSpec() corev1.NodeSpec {
	return corev1.NodeSpec{Taints: []corev1.Taint{{Key: offload.TaintVirtualNode, Value: "true", Effect: corev1.TaintEffectNoExecute}}}
}

func nodeLease(name string, labels map[string]string) *coordinationv1.Lease {
	holder, seconds, now := name, int32(40), metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease, Labels: labels},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &now},
	}
}

// With its own token the agent makes, keeps and removes a virtual node
// and its Lease, and may write no other Node or node Lease: not a real
// node, its status or its heartbeat, not one named like ours without our
// labels, and it cannot adopt a real one by labelling it.
func (g *grant) testVirtualNodes(t *testing.T) {
	ctx := t.Context()
	admin := g.cp.Client
	nodes, leases := g.agent.CoreV1().Nodes(), g.agent.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	create := metav1.CreateOptions{}

	// A real node and its heartbeat, as a kubelet makes them, and a node
	// named like a virtual node with one of our labels but not both.
	worker, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}, create)
	if err != nil {
		t.Fatal(err)
	}
	workerLease, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, nodeLease(worker.Name, nil), create)
	if err != nil {
		t.Fatal(err)
	}
	// Both carry the taint where the refusal is meant for the name or the
	// labels: untainted, the taint policy would refuse them too, and which
	// refusal the API server reports first is not fixed.
	lookalike := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: offload.VirtualNodeName("cother"), Labels: map[string]string{offload.LabelVirtualNode: "true"}}, Spec: virtualNodeSpec()}
	if _, err := admin.CoreV1().Nodes().Create(ctx, lookalike, create); err != nil {
		t.Fatal(err)
	}

	name := offload.VirtualNodeName(consumerID)
	virtual := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: virtualNodeLabels()},
		Spec:       virtualNodeSpec(),
	}
	if _, err := nodes.Create(ctx, virtual, create); err != nil {
		t.Fatalf("the agent creates a virtual node: %v", err)
	}
	status := `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"PeerReady","message":"test"}],"capacity":{"cpu":"4"}}}`
	if _, err := nodes.Patch(ctx, name, types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("the agent writes its virtual node's status: %v", err)
	}
	if _, err := nodes.Patch(ctx, name, types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"region":"eu"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the agent labels its virtual node: %v", err)
	}
	lease, err := leases.Create(ctx, nodeLease(name, virtualNodeLabels()), create)
	if err != nil {
		t.Fatalf("the agent creates its virtual node's Lease: %v", err)
	}
	renew := metav1.NewMicroTime(time.Now())
	lease.Spec.RenewTime = &renew
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the agent renews its virtual node's Lease: %v", err)
	}

	notOne := func(name string) string { return name + " is not one" }
	wouldNot := func(name string) string { return name + " would not be one" }
	patch := func(name, body string, subresource ...string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := nodes.Patch(ctx, name, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, subresource...)
			return err
		}
	}
	ours := fmt.Sprintf(`{"metadata":{"labels":{%q:"true","app.kubernetes.io/managed-by":"flotilla"}}}`, offload.LabelVirtualNode)
	adopt := fmt.Sprintf(`{"metadata":{"labels":{%q:"true","app.kubernetes.io/managed-by":"flotilla"}},"spec":{"taints":[{"key":%q,"value":"true","effect":"NoExecute"}]}}`, offload.LabelVirtualNode, offload.TaintVirtualNode)
	for _, r := range []refusal{
		{"label a real node", notOne("worker-1"), patch("worker-1", `{"metadata":{"labels":{"region":"eu"}}}`)},
		{"adopt a real node by labelling it a virtual node", notOne("worker-1"), patch("worker-1", adopt)},
		{"taint a real node", notOne("worker-1"), patch("worker-1", `{"spec":{"taints":[{"key":"x","effect":"NoExecute"}]}}`)},
		{"write a real node's status", notOne("worker-1"), patch("worker-1", status, "status")},
		{"delete a real node", notOne("worker-1"), func(ctx context.Context) error {
			return nodes.Delete(ctx, "worker-1", metav1.DeleteOptions{})
		}},
		{"label a node named like a virtual node without both labels", notOne(lookalike.Name), patch(lookalike.Name, ours)},
		{"delete a node named like a virtual node without both labels", notOne(lookalike.Name), func(ctx context.Context) error {
			return nodes.Delete(ctx, lookalike.Name, metav1.DeleteOptions{})
		}},
		{"create a node with our labels under another name", wouldNot("worker-2"), func(ctx context.Context) error {
			_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-2", Labels: virtualNodeLabels()}, Spec: virtualNodeSpec()}, create)
			return err
		}},
		{"create a node named flotilla-* without our labels", wouldNot("flotilla-cthird"), func(ctx context.Context) error {
			_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-cthird"}, Spec: virtualNodeSpec()}, create)
			return err
		}},
		{"take the virtual-node label off its virtual node", wouldNot(name), patch(name, fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, offload.LabelVirtualNode))},
		// Untainted, a virtual node would draw the cluster's pods.
		{"create a virtual node without its taint", "keeps its virtual nodes tainted", func(ctx context.Context) error {
			_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: offload.VirtualNodeName("cthird"), Labels: virtualNodeLabels()}}, create)
			return err
		}},
		{"take the taint off its virtual node", "keeps its virtual nodes tainted", patch(name, `{"spec":{"taints":[]}}`)},
		{"renew a real node's Lease", notOne("worker-1"), func(ctx context.Context) error {
			l := workerLease.DeepCopy()
			l.Spec.RenewTime = &renew
			_, err := leases.Update(ctx, l, metav1.UpdateOptions{})
			return err
		}},
		{"delete a real node's Lease", notOne("worker-1"), func(ctx context.Context) error {
			return leases.Delete(ctx, "worker-1", metav1.DeleteOptions{})
		}},
		{"create a Lease for a real node", wouldNot("worker-2"), func(ctx context.Context) error {
			_, err := leases.Create(ctx, nodeLease("worker-2", virtualNodeLabels()), create)
			return err
		}},
	} {
		t.Run(r.what, func(t *testing.T) { r.check(t, "the agent") })
	}

	got, err := admin.CoreV1().Nodes().Get(ctx, worker.Name, metav1.GetOptions{})
	if err != nil || got.UID != worker.UID || got.Labels["region"] != "" || got.Labels[offload.LabelVirtualNode] != "" {
		t.Errorf("the real node after the agent's refused writes: %v, labels %v", err, got.Labels)
	}
	gotLease, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, workerLease.Name, metav1.GetOptions{})
	if err != nil || gotLease.ResourceVersion != workerLease.ResourceVersion {
		t.Errorf("the real node's Lease after the agent's refused writes: %v, %v", err, gotLease)
	}

	if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the agent deletes its virtual node's Lease: %v", err)
	}
	if err := nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the agent deletes its virtual node: %v", err)
	}
}
