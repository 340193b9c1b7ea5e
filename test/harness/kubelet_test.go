package harness_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/flotilla-io/flotilla/test/harness"
)

// A pod bound to the pretend kubelet's node runs with an address from the
// node's pod range, in a network namespace behind the cluster's site, and
// is gone, namespace included, once deleted.
func TestKubeletRunsPodsBehindSite(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cidr := netip.MustParsePrefix("10.0.0.0/16")
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: cidr, Scheduler: true})
	site := env.NewSite("a", harness.SiteOptions{LAN: env.NewLAN("lan"), PodCIDR: cidr})
	k := cp.StartKubelet("node1", harness.KubeletOptions{Site: site})
	if !cidr.Contains(k.PodCIDR().Addr()) || k.PodCIDR().Bits() != 24 {
		t.Fatalf("node pod range %s: want a /24 of %s allocated by the controller manager", k.PodCIDR(), cidr)
	}
	ctx := context.Background()
	// No nodeName: kube-scheduler binds it.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web"}}},
	}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPodRunning(t, cp, "web", 60*time.Second)
	ip := netip.MustParseAddr(running.Status.PodIP)
	if !k.PodCIDR().Contains(ip) {
		t.Fatalf("pod IP %s outside the node's range %s", ip, k.PodCIDR())
	}
	netns, ok := k.PodNetns(running.UID)
	if !ok || netns.Addr != ip {
		t.Fatalf("pod has no network namespace with %s", ip)
	}
	if err := netns.Ping(site.Addr); err != nil {
		t.Fatalf("pod cannot reach its site: %v", err)
	}
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "web")
	if err := site.Ping(ip); err == nil {
		t.Fatalf("deleted pod %s still answers", ip)
	}
}

// Once its range has no address never given, the pretend kubelet gives
// those of deleted pods again, oldest first, whether the deletion went
// through it or the pod was removed at once: a long run's churn cannot
// exhaust a node.
func TestKubeletReusesAddressesOfDeletedPods(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	// .0 is skipped: .1, .2 and .3 are the node's three addresses.
	k := cp.StartKubelet("node1", harness.KubeletOptions{PodCIDR: netip.MustParsePrefix("10.9.0.0/30")})
	ctx := context.Background()
	pods := cp.Client.CoreV1().Pods("default")
	run := func(name string) netip.Addr {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: k.NodeName, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return netip.MustParseAddr(waitPodRunning(t, cp, name, 30*time.Second).Status.PodIP)
	}
	gone := func(name string, grace int64) {
		t.Helper()
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, cp, name)
	}
	for i, want := range []string{"10.9.0.1", "10.9.0.2", "10.9.0.3"} {
		if got := run(fmt.Sprintf("p%d", i)); got.String() != want {
			t.Fatalf("pod p%d got %s, want %s (fresh addresses in order)", i, got, want)
		}
	}
	gone("p1", 30) // through the kubelet's confirmation
	gone("p0", 0)  // removed at once
	if got := run("p3"); got.String() != "10.9.0.2" {
		t.Fatalf("p3 got %s, want 10.9.0.2 (the first freed)", got)
	}
	if got := run("p4"); got.String() != "10.9.0.1" {
		t.Fatalf("p4 got %s, want 10.9.0.1 (freed second)", got)
	}
}

// A node the node lifecycle controller marked not ready (its lease was
// stale while the control plane was down) is posted Ready again by the
// pretend kubelet, as a kubelet does at its next status update.
func TestKubeletPostsItsNodeReadyAgain(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	k := cp.StartKubelet("node1", harness.KubeletOptions{PodCIDR: netip.MustParsePrefix("10.9.0.0/24")})
	ctx := context.Background()
	nodes := cp.Client.CoreV1().Nodes()
	// The node controller's write, read again when the kubelet or the
	// controller manager wrote the node in between (as the controller
	// does).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, k.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
			}
		}
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var ready corev1.ConditionStatus
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, k.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c.Status
			}
		}
		return ready == corev1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("node Ready %q, want True again: %v", ready, err)
	}
}

// waitPodRunning waits up to within for the pod name in default to be
// Running and returns it.
func waitPodRunning(t *testing.T, cp *harness.ControlPlane, name string, within time.Duration) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod %s not Running (last status %+v): %v", name, last.Status, err)
	}
	return last
}

// waitPodGone waits until the pod name in default is no longer in the API.
func waitPodGone(t *testing.T, cp *harness.ControlPlane, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s still in the API: %v", name, err)
	}
}
