package federation

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestPodSpec runs the test server (harness.TestServerImage), Ready once
// it listens, with requests when given; it meets Pod Security restricted,
// as a consumer's pods must to run on a provider.
func TestPodSpec(requests corev1.ResourceList) corev1.PodSpec {
	return *harness.Restricted(&corev1.PodSpec{
		TerminationGracePeriodSeconds: new(int64),
		Containers: []corev1.Container{{
			Name: "server", Image: harness.TestServerImage, ImagePullPolicy: corev1.PullNever,
			Env:       []corev1.EnvVar{harness.TestServerUID},
			Resources: corev1.ResourceRequirements{Requests: requests},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(harness.TestServerTCPPort)}},
				PeriodSeconds: 1,
			},
		}},
	})
}

// CreateDeployment creates a Deployment of the test server in ns of c,
// its pods labelled app=name.
func CreateDeployment(t harness.TB, c *NodeCluster, ns, name string, replicas int32, requests corev1.ResourceList) {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: TestPodSpec(requests)},
		},
	}
	if _, err := c.CP.Client.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment %s/%s on %s: %v", ns, name, c.Name, err)
	}
}

// WaitOffloadCredential waits until c holds a working credential of
// provider's grant (its Peer's OffloadCredential condition is Ready).
func WaitOffloadCredential(t harness.TB, c *NodeCluster, provider string, timeout time.Duration) {
	t.Helper()
	within(t, timeout, c.Name+"'s credential from "+provider, func() error {
		peers, err := c.Peers(context.Background())
		if err != nil {
			return err
		}
		p, ok := peers[provider]
		if !ok {
			return fmt.Errorf("no Peer for %s", provider)
		}
		if cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionOffloadCredential); cond == nil || cond.Reason != "Ready" {
			return fmt.Errorf("condition %s: %+v", v1alpha1.ConditionOffloadCredential, cond)
		}
		return nil
	})
}

// WaitDeployment waits until ns of c has exactly n pods labelled
// app=name, all Ready, and returns them.
func WaitDeployment(t harness.TB, c *NodeCluster, ns, name string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	within(t, timeout, fmt.Sprintf("%d pods app=%s Ready in %s on %s", n, name, ns, c.Name), func() error {
		list, err := c.CP.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return err
		}
		if pods = list.Items; len(pods) != n {
			return fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			if err := PodReady(p); err != nil {
				return err
			}
		}
		return nil
	})
	return pods
}

// within calls cond until it returns nil, or fails t with what and cond's
// last error after d (eventually.Within, for a harness.TB).
func within(t harness.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	if _, err := eventually.Until(d, what, cond); err != nil {
		t.Fatalf("%v", err)
	}
}
