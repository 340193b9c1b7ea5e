package harness_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-io/flotilla/test/harness"
)

// A pod bound to the pretend kubelet's node runs with an address from the
// node's pod range, in a network namespace behind the cluster's site, and
// is gone, namespace included, once deleted.
func TestKubeletRunsPodsBehindSite(t *testing.T) {
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
	var running *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		running = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod not Running (last status %+v): %v", running.Status, err)
	}
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
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("deleted pod still in the API: %v", err)
	}
	if err := site.Ping(ip); err == nil {
		t.Fatalf("deleted pod %s still answers", ip)
	}
}
