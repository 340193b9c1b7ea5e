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

// The pretend kubelet hands the addresses of deleted pods out again, so
// that pods made and deleted without end never exhaust a node's range:
// in a /30 (three addresses), pods deleted gracefully and at once leave
// room for as many new ones, each with an address no live pod has.
func TestKubeletReusesReleasedAddresses(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	k := cp.StartKubelet("node1", harness.KubeletOptions{PodCIDR: netip.MustParsePrefix("10.9.0.0/30")})
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")
	running := func(name string) *corev1.Pod {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: k.NodeName, Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
		}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
			return err == nil, nil // the default account may not be there yet
		})
		if err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		var p *corev1.Pod
		err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err = pods.Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, nil
		})
		if err != nil {
			t.Fatalf("pod %s not Running: %v", name, err)
		}
		return p
	}
	gone := func(name string, grace *int64) {
		t.Helper()
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: grace}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := pods.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("pod %s not deleted: %v", name, err)
		}
	}
	live := map[string]string{} // pod -> address
	for _, name := range []string{"a", "b", "c"} {
		live[name] = running(name).Status.PodIP
	}
	gone("a", nil)        // confirmed by the kubelet
	gone("b", new(int64)) // never seen terminating
	delete(live, "a")
	delete(live, "b")
	for _, name := range []string{"d", "e"} {
		ip := running(name).Status.PodIP
		for other, taken := range live {
			if ip == taken {
				t.Fatalf("pod %s got %s, the address of live pod %s", name, ip, other)
			}
		}
		if !k.PodCIDR().Contains(netip.MustParseAddr(ip)) {
			t.Fatalf("pod %s got %s, outside %s", name, ip, k.PodCIDR())
		}
		live[name] = ip
	}
}
