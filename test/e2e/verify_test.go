package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// testVerify runs `flotilla verify` from a (which holds a grant from b
// and forwards clusterset.local to its agent) to b: every check passes
// and nothing of the run is left on either cluster; interrupted, it
// still removes what it made; from b, which holds no grant of a, the
// offload checks are skipped and say why.
func testVerify(t *testing.T, a, b *federation.NodeCluster) {
	// For the run from b: b's pods resolve clusterset.local too.
	b.ForwardClusterset(t)
	t.Run("flotilla verify passes every check and leaves nothing", func(t *testing.T) {
		table, code := runVerify(t, a, b, "2m")
		if code != 0 || !strings.Contains(table, "PASSED") {
			t.Errorf("verify: exit %d; want 0 and PASSED", code)
		}
		for _, check := range []string{"pod to pod", "pod to pod (back)", "service", "exported service", "offloaded pod", "logs via virtual node"} {
			if line := checkLine(table, check); !strings.Contains(line, "PASS") {
				t.Errorf("check %q: %q, want PASS", check, line)
			}
		}
		noVerifyLeft(t, verifyNamespace(t, table), a, b)
	})

	t.Run("Ctrl-C in the middle of verify still removes what it made", func(t *testing.T) {
		cmd := exec.Command(harness.Flotilla(t), "verify", "--kubeconfig", a.CP.Kubeconfig, "--remote-kubeconfig", b.CP.Kubeconfig, "--wait", "2m")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The witness that it is under way: its server pod runs on b.
		var ns string
		eventually.Within(t, 60*time.Second, "verify's server pod on b", func() error {
			pods, err := b.CP.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{LabelSelector: "flotilla.io/verify=true,app=server-b"})
			if err != nil || len(pods.Items) == 0 {
				return fmt.Errorf("%d pods, err %v", len(pods.Items), err)
			}
			ns = pods.Items[0].Namespace
			return nil
		})
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		t.Logf("flotilla verify, interrupted: %v\n%s", err, out.String())
		if !strings.Contains(out.String(), "deleting namespace "+ns) {
			t.Errorf("interrupted verify did not say it deletes %s", ns)
		}
		noVerifyLeft(t, ns, a, b)
	})

	t.Run("from b, which holds no grant of a, the offload checks say skipped and the rest pass", func(t *testing.T) {
		table, code := runVerify(t, b, a, "90s")
		if code != 0 || !strings.Contains(table, "PASSED") {
			t.Errorf("verify from b: exit %d; want 0 and PASSED", code)
		}
		for _, check := range []string{"offloaded pod", "logs via virtual node"} {
			if line := checkLine(table, check); !strings.Contains(line, "SKIPPED  skipped: no grant from a (") {
				t.Errorf("check %q from b: %q, want it skipped for want of a grant from a", check, line)
			}
		}
		for _, check := range []string{"pod to pod", "pod to pod (back)", "service", "exported service"} {
			if line := checkLine(table, check); !strings.Contains(line, "PASS") {
				t.Errorf("check %q from b: %q, want PASS", check, line)
			}
		}
		noVerifyLeft(t, verifyNamespace(t, table), b, a)
	})
}

// testVerifyFails runs verify from a to b with b's agent scaled to 0:
// the pods no longer reach each other, and the table says so with exit
// status 1. It runs last: b's agent comes back for the uninstall, and
// nothing after it needs the Peers Connected again.
func testVerifyFails(t *testing.T, a, b *federation.NodeCluster) {
	t.Run("with b's agent down, verify says the pods do not reach each other and fails", func(t *testing.T) {
		scaleAgent(t, b, 0)
		defer scaleAgent(t, b, 1)
		// The witness that the path is down: a's pod no longer reaches b's.
		eventually.Within(t, 60*time.Second, "a's pod cut off from b's", func() error {
			url := fmt.Sprintf("http://%s:%d/", federation.ViewOf(t, a.Cluster, b.Cluster, netip.MustParseAddr(b.Web.Status.PodIP)), harness.TestServerHTTPPort)
			if out, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", url); err == nil {
				return fmt.Errorf("GET %s from a still answered: %s", url, out)
			}
			return nil
		})
		// The probes get what the server pods leave of --wait; on a
		// loaded machine those took over 25 s to be Ready.
		table, code := runVerify(t, a, b, "60s")
		if code != 1 || !strings.Contains(table, "FAILED") {
			t.Errorf("verify with b's agent down: exit %d; want 1 and FAILED", code)
		}
		// Failed for the right reason: the probes ran and no answer came.
		for _, check := range []string{"pod to pod", "pod to pod (back)"} {
			if line := checkLine(table, check); !strings.Contains(line, "FAIL") || !strings.Contains(line, "no answer from server-") {
				t.Errorf("with b's agent down, check %q: %q, want FAIL with no answer from the server", check, line)
			}
		}
		ns := verifyNamespace(t, table)
		noVerifyLeft(t, ns, a, b)
	})
}

// runVerify runs verify from a to b and returns its table (stdout; the
// progress on stderr is logged with it) and exit status.
func runVerify(t *testing.T, a, b *federation.NodeCluster, wait string) (string, int) {
	t.Helper()
	args := []string{"verify", "--kubeconfig", a.CP.Kubeconfig, "--remote-kubeconfig", b.CP.Kubeconfig, "--wait", wait}
	cmd := exec.Command(harness.Flotilla(t), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("flotilla verify: %v", err)
	}
	t.Logf("flotilla %s: exit %d\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, stderr.String())
	return string(out), code
}

// checkLine is the table's line of check name.
func checkLine(table, name string) string {
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, name+"  ") {
			return line
		}
	}
	return ""
}

// verifyNamespace is the run's namespace, as the table's last line
// names it.
func verifyNamespace(t *testing.T, table string) string {
	t.Helper()
	i := strings.LastIndex(table, "namespace verify-flotilla-")
	if i < 0 {
		t.Fatalf("the table names no namespace:\n%s", table)
	}
	return strings.Fields(table[i+len("namespace "):])[0]
}

// noVerifyLeft checks that the run's namespace is gone from a and b, and
// so is the namespace b held for it as a's provider.
func noVerifyLeft(t *testing.T, ns string, a, b *federation.NodeCluster) {
	t.Helper()
	for _, c := range []*federation.NodeCluster{a, b} {
		if _, err := c.CP.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s on %s after verify: err %v, want not found", ns, c.Name, err)
		}
	}
	eventually.Within(t, 60*time.Second, "b's namespace for a's "+ns+" gone", func() error {
		list, err := b.CP.Client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelMirroredFrom + "=" + ns})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%s still has %s, mirrored from %s", b.Name, list.Items[0].Name, ns)
		}
		return nil
	})
}

func scaleAgent(t *testing.T, c *federation.NodeCluster, replicas int) {
	t.Helper()
	mustKubectl(t, c.CP, "-n", federation.AgentNamespace, "scale", "deployment/flotilla-agent", fmt.Sprintf("--replicas=%d", replicas))
	eventually.Within(t, 2*time.Minute, fmt.Sprintf("%s's agent at %d replicas", c.Name, replicas), func() error {
		if replicas == 0 {
			pods, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: federation.AgentSelector})
			if err != nil || len(pods.Items) > 0 {
				return fmt.Errorf("%d agent pods, err %v", len(pods.Items), err)
			}
			return nil
		}
		_, err := c.AgentPod(context.Background())
		return err
	})
}
