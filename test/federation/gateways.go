package federation

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/test/harness"
)

// waitAgents waits until c's agent is Ready: its one pod (AgentPod), or
// with several gateway candidates two Ready replicas, one of them the
// active one (ActiveAgent). On a timeout it says what each agent pod
// wrote last.
func (c *NodeCluster) waitAgents(t harness.TB) {
	t.Helper()
	if !c.replicated() {
		waitPod(t, c.Gateway, "agent pod of "+c.Name+" Ready", c.AgentPod)
		return
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := c.agentsReady(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("two agent replicas of %s Ready, one active: not within 90s: %v\n%s", c.Name, err, c.agentLogs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// agentsReady says why c's agent is not two Ready replicas, one active.
func (c *NodeCluster) agentsReady(ctx context.Context) error {
	pods, err := c.AgentPods(ctx)
	if err != nil {
		return err
	}
	ready := 0
	for _, p := range pods {
		if PodReady(p) == nil {
			ready++
		}
	}
	if ready < 2 {
		return fmt.Errorf("%d of %d agent pods Ready, want 2", ready, len(pods))
	}
	p, err := c.ActiveAgent(ctx)
	if err != nil {
		return err
	}
	return PodReady(p)
}

// agentLogs is, for each agent pod, its state and the last lines its
// container wrote, and those of its previous container if it restarted.
func (c *NodeCluster) agentLogs() string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := c.AgentPods(ctx)
	if err != nil {
		return fmt.Sprintf("(agent pods: %v)", err)
	}
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "agent pod %s on %s: %v\n", p.Name, p.Spec.NodeName, PodReady(p))
		tail := int64(30)
		for _, previous := range []bool{true, false} {
			out, err := c.CP.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Previous: previous, TailLines: &tail}).DoRaw(ctx)
			if err == nil {
				fmt.Fprintf(&b, "  logs (previous container: %v):\n%s\n", previous, out)
			}
		}
	}
	return b.String()
}

// AgentPods are the agent's pods, whatever their state.
func (c *NodeCluster) AgentPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := c.CP.Client.CoreV1().Pods(AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// ActiveAgent returns the agent pod labelled as the active replica
// (flotilla.io/gateway-role=active); an error says why there is not
// exactly one.
func (c *NodeCluster) ActiveAgent(ctx context.Context) (corev1.Pod, error) {
	pods, err := c.CP.Client.CoreV1().Pods(AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector + "," + ha.RoleLabel + "=" + ha.RoleActive})
	if err != nil {
		return corev1.Pod{}, err
	}
	if len(pods.Items) != 1 {
		return corev1.Pod{}, fmt.Errorf("%d agent pods labelled %s=%s, want 1", len(pods.Items), ha.RoleLabel, ha.RoleActive)
	}
	return pods.Items[0], nil
}

// Candidate returns c's gateway candidate named name, or nil.
func (c *NodeCluster) Candidate(name string) *harness.Node {
	for _, n := range c.Candidates {
		if n.NodeName == name {
			return n
		}
	}
	return nil
}

// RemoveDeadNode does what an operator does once a node died for good
// (harness Node.Kill): deletes its Node and force-deletes the pods bound
// to it, so that their controllers place them elsewhere.
func (c *NodeCluster) RemoveDeadNode(t harness.TB, n *harness.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CP.Client.CoreV1().Nodes().Delete(ctx, n.NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete node %s of %s: %v", n.NodeName, c.Name, err)
	}
	pods, err := c.CP.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", n.NodeName).String()})
	if err != nil {
		t.Fatalf("list the pods of node %s of %s: %v", n.NodeName, c.Name, err)
	}
	zero := int64(0)
	for _, p := range pods.Items {
		if err := c.CP.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("force-delete pod %s/%s of the dead node %s: %v", p.Namespace, p.Name, n.NodeName, err)
		}
	}
}
