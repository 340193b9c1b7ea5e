package harness_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-io/flotilla/test/harness"
)

// Real nodes: a cluster of a gateway node and two workers runs a
// Deployment of the test server as real containers on the workers; pods
// reach each other across nodes with their own addresses and through a
// Service's ClusterIP (kube-proxy, nftables); `kubectl logs`, `kubectl
// exec` and `kubectl port-forward` work through the API server. Nothing of the run is left after it.
func TestRealNodes(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	var run string
	t.Run("cluster", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
		gw := cp.StartNode("gw", harness.NodeOptions{Role: "gateway"})
		workers := cp.StartNodes(harness.NodeOptions{Role: "worker"}, "w1", "w2")
		ctx := context.Background()

		web := runTestServers(t, cp, "web", 2, map[string]string{harness.RoleLabel: "worker"})
		byNode := map[string]corev1.Pod{}
		for _, p := range web {
			byNode[p.Spec.NodeName] = p
		}
		for _, w := range workers {
			p, ok := byNode[w.NodeName]
			if !ok {
				t.Fatalf("no web pod on worker %s (pods on %v)", w.NodeName, keys(byNode))
			}
			if ip := netip.MustParseAddr(p.Status.PodIP); !w.PodCIDR.Contains(ip) {
				t.Fatalf("pod %s has %s, outside its node's slice %s", p.Name, ip, w.PodCIDR)
			}
		}
		a, b := byNode["w1"], byNode["w2"]

		// Across nodes, with the client's own address (no masquerade).
		kubectl := kubectlOf(cp)
		seen := kubectl(t, "exec", a.Name, "--", "/testserver", "-get", fmt.Sprintf("http://%s:%d/peer", b.Status.PodIP, harness.TestServerHTTPPort))
		if strings.TrimSpace(seen) != a.Status.PodIP {
			t.Fatalf("pod on w2 saw pod on w1 (%s) as %q", a.Status.PodIP, seen)
		}

		// Through the Service from a pod on the gateway node: both
		// backends answer.
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "web"},
				Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(harness.TestServerHTTPPort)}},
			},
		}
		svc, err := cp.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		client := runTestServers(t, cp, "client", 1, map[string]string{harness.RoleLabel: "gateway"})[0]
		if client.Spec.NodeName != gw.NodeName {
			t.Fatalf("client pod on %s, want the gateway node", client.Spec.NodeName)
		}
		hosts := map[string]bool{}
		url := fmt.Sprintf("http://%s/hostname", svc.Spec.ClusterIP)
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			out, err := kubectlErr("exec", client.Name, "--", "/testserver", "-get", url)(cp)
			if err == nil {
				hosts[strings.TrimSpace(out)] = true
			}
			return hosts[a.Name] && hosts[b.Name], nil
		})
		if err != nil {
			t.Fatalf("through ClusterIP %s the client reached %v, want both %s and %s", svc.Spec.ClusterIP, keys(hosts), a.Name, b.Name)
		}

		// kubectl logs shows what the server logged about the client.
		logs := kubectl(t, "logs", b.Name)
		if !strings.Contains(logs, "http /peer from "+a.Status.PodIP) {
			t.Fatalf("kubectl logs %s lacks the request from %s:\n%s", b.Name, a.Status.PodIP, logs)
		}

		// kubectl port-forward reaches the pod from this host.
		if got := portForwardGet(t, cp, b.Name, harness.TestServerHTTPPort, "/hostname"); strings.TrimSpace(got) != b.Name {
			t.Fatalf("GET /hostname through port-forward to %s: %q", b.Name, got)
		}
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

// runTestServers runs a Deployment of n test servers on nodes matching
// selector, one per node, and returns its pods once all are Ready.
func runTestServers(t testing.TB, cp *harness.ControlPlane, name string, n int32, selector map[string]string) []corev1.Pod {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  selector,
					TerminationGracePeriodSeconds: new(int64),
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
							TopologyKey:   "kubernetes.io/hostname",
						}},
					}},
					Containers: []corev1.Container{{
						Name: "server", Image: harness.TestServerImage, ImagePullPolicy: corev1.PullNever,
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(harness.TestServerTCPPort)}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := cp.Client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment %s: %v", name, err)
	}
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		ready := 0
		for _, p := range pods {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == int(n) && len(pods) == int(n), nil
	})
	if err != nil {
		var states []string
		for _, p := range pods {
			states = append(states, fmt.Sprintf("%s on %q: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses))
		}
		t.Fatalf("Deployment %s: %d pods not Ready: %v", name, n, states)
	}
	return pods
}

// kubectlOf runs the pinned kubectl against cp and fails the test on error.
func kubectlOf(cp *harness.ControlPlane) func(t testing.TB, args ...string) string {
	return func(t testing.TB, args ...string) string {
		t.Helper()
		out, err := kubectlErr(args...)(cp)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}

func kubectlErr(args ...string) func(cp *harness.ControlPlane) (string, error) {
	return func(cp *harness.ControlPlane) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		argv := append([]string{"--kubeconfig", cp.Kubeconfig}, args...)
		out, err := exec.CommandContext(ctx, filepath.Join(harness.KubeBinDir(), "kubectl"), argv...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
}

// portForwardGet runs `kubectl port-forward` to pod's port on a free local
// port and GETs path through it.
func portForwardGet(t testing.TB, cp *harness.ControlPlane, pod string, port int, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(harness.KubeBinDir(), "kubectl"), "--kubeconfig", cp.Kubeconfig,
		"port-forward", "pod/"+pod, fmt.Sprintf(":%d", port), "--address", "127.0.0.1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	// "Forwarding from 127.0.0.1:41234 -> 8080"
	lines := bufio.NewScanner(out)
	var local string
	for lines.Scan() {
		if f := strings.Fields(lines.Text()); len(f) == 5 && f[0] == "Forwarding" {
			local = f[2]
			break
		}
	}
	if local == "" {
		t.Fatalf("kubectl port-forward %s printed no local address: %s", pod, stderr.String())
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + local + path)
	if err != nil {
		t.Fatalf("GET %s through port-forward to %s: %v (kubectl: %s)", path, pod, err, stderr.String())
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
