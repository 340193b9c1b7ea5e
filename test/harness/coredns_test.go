package harness_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The cluster DNS: every cluster of real nodes runs CoreDNS behind the
// kube-dns Service at the 10th address of the service range; a pod's
// resolv.conf names it, and the pod reaches a Service by its
// cluster.local name, answered by the Service's own pod. A name no
// Service has does not resolve. Nothing of the run is left after it.
func TestClusterDNS(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	var run string
	t.Run("cluster", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
		cp.StartNodes(harness.NodeOptions{}, "n1", "n2")
		ctx := context.Background()

		svc, err := cp.Client.CoreV1().Services(harness.DNSNamespace).Get(ctx, harness.DNSService, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := cp.DNSAddr(); svc.Spec.ClusterIP != want.String() || want != netip.MustParseAddr("10.96.0.10") {
			t.Fatalf("Service %s at %s, want %s (the 10th address of %s)", harness.DNSService, svc.Spec.ClusterIP, want, cp.Options.ServiceCIDR)
		}
		dns := cp.WaitDNS(t)
		t.Logf("CoreDNS pod %s Ready on %s", dns.Name, dns.Spec.NodeName)

		echo := runTestServers(t, cp, "echo", 1, nil)[0]
		if _, err := cp.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "echo"},
				Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(harness.TestServerHTTPPort)}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		client := runTestServers(t, cp, "client", 1, nil)[0]

		resolv := kubectlOf(cp)(t, "exec", client.Name, "--", "/testserver", "-cat", "/etc/resolv.conf")
		if !strings.Contains(resolv, "nameserver "+cp.DNSAddr().String()) || !strings.Contains(resolv, "default.svc."+harness.ClusterDomain) {
			t.Fatalf("pod %s's resolv.conf names no cluster DNS at %s:\n%s", client.Name, cp.DNSAddr(), resolv)
		}

		for _, name := range []string{"echo.default.svc." + harness.ClusterDomain, "echo"} {
			url := fmt.Sprintf("http://%s/hostname", name)
			eventually.Within(t, 30*time.Second, "pod "+client.Name+" GET "+url, func() error {
				out, err := kubectlErr("exec", client.Name, "--", "/testserver", "-get", url)(cp)
				if err != nil {
					return err
				}
				if got := strings.TrimSpace(out); got != echo.Name {
					return fmt.Errorf("%s answered by %q, want the Service's pod %s", url, got, echo.Name)
				}
				return nil
			})
		}

		// The name of no Service: CoreDNS answers, with no address.
		out, err := kubectlErr("exec", client.Name, "--", "/testserver", "-get", "http://nothere.default.svc."+harness.ClusterDomain+"/")(cp)
		if err == nil || !strings.Contains(out, "no such host") {
			t.Fatalf("GET of a name no Service has: %v: %s, want no such host", err, out)
		}
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}
