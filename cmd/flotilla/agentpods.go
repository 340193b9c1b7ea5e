package main

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// agentDeployment is the agent's Deployment, as deploy/ names it.
const agentDeployment = "flotilla-agent"

func podsOf(ctx context.Context, kube kubeclient.Interface, ns string, sel *metav1.LabelSelector) ([]corev1.Pod, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, err
	}
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: s.String()})
	if err != nil {
		return nil, err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items, nil
}

// podReady says whether p's Ready condition is true.
func podReady(p corev1.Pod) bool { return whyNotReady(p) == nil }

// whyNotReady says why p is not Ready, or nil.
func whyNotReady(p corev1.Pod) error {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			return fmt.Errorf("pod %s: container %s waiting: %s: %s", p.Name, c.Name, w.Reason, w.Message)
		}
	}
	return fmt.Errorf("pod %s %s, not Ready", p.Name, p.Status.Phase)
}

// containerPort is the number of the pod's port named name, else def.
func containerPort(p corev1.Pod, name string, def int) int {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return int(cp.ContainerPort)
			}
		}
	}
	return def
}
