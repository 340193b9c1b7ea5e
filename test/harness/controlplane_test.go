package harness_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-io/flotilla/test/harness"
)

// Two control planes start concurrently and are independent, real
// clusters: objects land in each, and the controller manager turns a
// Deployment into a ReplicaSet.
func TestControlPlanes(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	var run string
	t.Run("env", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		cps := env.ControlPlanes(2, harness.ControlPlaneOptions{})
		ctx := context.Background()
		for _, cp := range cps {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-" + cp.Name}}
			if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
				t.Fatalf("%s: create namespace: %v", cp.Name, err)
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"cluster": cp.Name}}
			if _, err := cp.Client.CoreV1().ConfigMaps(ns.Name).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatalf("%s: create ConfigMap: %v", cp.Name, err)
			}
		}
		// Separate etcds: cp1's namespace does not exist in cp2.
		if _, err := cps[1].Client.CoreV1().Namespaces().Get(ctx, "team-cp1", metav1.GetOptions{}); err == nil {
			t.Fatal("cp2 sees cp1's namespace: the control planes share state")
		}
		assertDeploymentGetsReplicaSet(t, cps[0])
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

func assertDeploymentGetsReplicaSet(t *testing.T, cp *harness.ControlPlane) {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{"app": "web"}
	one := int32(1)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web"}}},
			},
		},
	}
	if _, err := cp.Client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment: %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		rs, err := cp.Client.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err == nil && len(rs.Items) == 1, nil
	})
	if err != nil {
		t.Fatalf("no ReplicaSet for the Deployment: %v", err)
	}
}

// An API server stopped alone and started again serves the same cluster:
// clients are refused while it is down, and what was written before is
// there after.
func TestAPIServerRestart(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp1", harness.ControlPlaneOptions{})
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"}, Data: map[string]string{"k": "v"}}
	if _, err := cp.Client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.StopAPIServer()
	if _, err := cp.Client.CoreV1().ConfigMaps("default").Get(ctx, "before", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server still answers after StopAPIServer")
	}
	if err := cp.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	got, err := cp.Client.CoreV1().ConfigMaps("default").Get(ctx, "before", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Fatalf("after the restart the ConfigMap holds %v", got.Data)
	}
}
