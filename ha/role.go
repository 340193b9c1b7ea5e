package ha

import (
	"context"
	"fmt"
	"time"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// RoleLabel is on the pod of the replica that holds the Lease, with the
// value RoleActive, and on no other: the agent's Services select it, so
// they send to the active replica only, whatever the standby's readiness.
const (
	RoleLabel  = "flotilla.io/gateway-role"
	RoleActive = "active"
)

// AgentSelector selects the agent's pods in its namespace.
const AgentSelector = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"

// Role writes RoleLabel on the agent's pods: set on this replica's own
// pod only, taken off any agent pod (the admission policy
// flotilla-agent-pods allows nothing more).
type Role struct {
	Kube      kubeclient.Interface
	Namespace string
	// Pod is this replica's pod; empty: the agent runs outside a pod,
	// and there is no label to write.
	Pod string
}

// MarkActive labels this replica's pod active and takes the label off
// every other agent pod: one whose node died with it keeps its label
// until the pod is deleted, and a Service would still send to it.
func (r *Role) MarkActive(ctx context.Context) error {
	if r.Pod == "" {
		return nil
	}
	if err := r.patch(ctx, r.Pod, RoleActive); err != nil {
		return err
	}
	pods, err := r.Kube.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector + "," + RoleLabel + "=" + RoleActive})
	if err != nil {
		return fmt.Errorf("list the agent pods labelled %s=%s: %w", RoleLabel, RoleActive, err)
	}
	for _, p := range pods.Items {
		if p.Name == r.Pod {
			continue
		}
		if err := r.patch(ctx, p.Name, ""); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// EventTookOver is the reason of the Event on a replica's pod when it
// has become the active one.
const EventTookOver = "GatewayTookOver"

// RecordTakeover writes an Event on this replica's pod saying that it
// runs the data path now, on node, since at: `kubectl get events` and
// `kubectl describe pod` tell when the gateway moved. The Event is
// labelled as the agent's; it expires with the API server's event TTL,
// or goes with the agent's namespace.
func (r *Role) RecordTakeover(ctx context.Context, node string, at time.Time) error {
	if r.Pod == "" {
		return nil
	}
	pod, err := r.Kube.CoreV1().Pods(r.Namespace).Get(ctx, r.Pod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read pod %s/%s for its takeover event: %w", r.Namespace, r.Pod, err)
	}
	now := metav1.NewTime(at)
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: r.Pod + ".", Namespace: r.Namespace, Labels: map[string]string{
			"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/managed-by": "flotilla",
		}},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: r.Namespace, Name: r.Pod, UID: pod.UID,
		},
		Reason:  EventTookOver,
		Message: fmt.Sprintf("this replica holds the Lease %s and runs the data path on node %s", LeaseName, node),
		Type:    corev1.EventTypeNormal, Source: corev1.EventSource{Component: "flotilla-agent", Host: node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := r.Kube.CoreV1().Events(r.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("record the takeover event on pod %s/%s: %w", r.Namespace, r.Pod, err)
	}
	return nil
}

// MarkStandby takes the label off this replica's pod; a container
// restarted in the same pod keeps the labels of its last run.
func (r *Role) MarkStandby(ctx context.Context) error {
	if r.Pod == "" {
		return nil
	}
	return r.patch(ctx, r.Pod, "")
}

// patch sets RoleLabel on pod to value, or removes it when value is "".
func (r *Role) patch(ctx context.Context, pod, value string) error {
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	body := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, RoleLabel, v)
	if _, err := r.Kube.CoreV1().Pods(r.Namespace).Patch(ctx, pod, types.MergePatchType, []byte(body), metav1.PatchOptions{FieldManager: "flotilla-agent"}); err != nil {
		if value == "" {
			return fmt.Errorf("remove the label %s from pod %s/%s: %w", RoleLabel, r.Namespace, pod, err)
		}
		return fmt.Errorf("label pod %s/%s %s=%s: %w", r.Namespace, pod, RoleLabel, value, err)
	}
	return nil
}
