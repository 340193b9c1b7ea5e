package main

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The cleanup Job's pod is what cleanup needs on that node and no more:
// the node's network, NET_ADMIN alone, no API token, no retry.
func TestCleanupJobPod(t *testing.T) {
	j := cleanupJob{node: "gw", namespace: "kube-system", image: "example.org/flotilla:v1"}
	job := j.job([]string{"--wireguard-interface=wg9"})
	p := job.Spec.Template.Spec
	c := p.Containers[0]
	switch {
	case p.NodeName != "gw" || !p.HostNetwork || p.RestartPolicy != corev1.RestartPolicyNever:
		t.Errorf("node %q, hostNetwork %v, restart %s", p.NodeName, p.HostNetwork, p.RestartPolicy)
	case p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken:
		t.Error("the pod mounts a service account token")
	case *job.Spec.BackoffLimit != 0:
		t.Errorf("backoffLimit %d", *job.Spec.BackoffLimit)
	case c.Image != "example.org/flotilla:v1" || !slices.Equal(c.Args, []string{"cleanup", "--wireguard-interface=wg9"}):
		t.Errorf("image %s, args %v", c.Image, c.Args)
	case c.SecurityContext.Privileged != nil || !slices.Equal(c.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) ||
		!slices.Equal(c.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("security context %+v", c.SecurityContext)
	case job.Labels["app.kubernetes.io/managed-by"] != "flotilla" || job.GenerateName != "flotilla-cleanup-gw-":
		t.Errorf("labels %v, generateName %q", job.Labels, job.GenerateName)
	}
}
