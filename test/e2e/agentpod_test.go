package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

const (
	agentNamespace = "flotilla-system"
	agentAccount   = "system:serviceaccount:" + agentNamespace + ":flotilla-agent"
	agentSelector  = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"
)

// podCluster is one cluster of TestAgentPodFromManifests: a control plane,
// its real gateway node, and a test server pod on that node.
type podCluster struct {
	*federation.Cluster
	gw  *harness.Node
	web corev1.Pod
}

// The agent as a cluster runs it: two clusters with overlapping pod
// networks, each a real gateway node on a shared LAN, install the agent
// with `kubectl apply -k` of deploy/ (plus only the cluster's settings)
// from its own image, built from this checkout. The agents run as pods
// under their service account, connect, and real pods on the gateway nodes
// talk by their views; `kubectl logs` shows the agent's log; the account
// can do exactly what docs/install.md lists. Nothing of the run is left.
func TestAgentPodFromManifests(t *testing.T) {
	harness.Require(t, harness.NeedsNodes...)
	var run string
	t.Run("federation", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		start := time.Now()
		tag := "flotilla.local/flotilla:test-" + run
		image := harness.FlotillaImage(t, tag)
		lan := env.NewLAN("lan")
		cidr := netip.MustParsePrefix("10.0.0.0/16")
		cps := env.ControlPlanes(2, harness.ControlPlaneOptions{PodCIDR: cidr})
		token := federationToken(t)

		var cs []*podCluster
		for i, cp := range cps {
			name := string(rune('a' + i))
			c, err := client.New(cp.Config, client.Options{Scheme: peerapi.Scheme()})
			if err != nil {
				t.Fatal(err)
			}
			gw := cp.StartNode("gw", harness.NodeOptions{Network: lan, Role: "gateway", Images: []string{image}})
			mustKubectl(t, cp, "label", "node", gw.NodeName, "flotilla.io/gateway=true")
			dir := writeKustomization(t, env, cp, gw, agentSettings{
				cluster: name, image: tag, podCIDR: cidr, token: token,
				iface: env.LinkName(name),
			})
			out := mustKubectl(t, cp, "apply", "--server-side", "-k", dir)
			t.Logf("cluster %s: kubectl apply -k (deploy/ and the cluster's settings):\n%s", name, out)
			cs = append(cs, &podCluster{Cluster: &federation.Cluster{Name: name, CP: cp, Client: c}, gw: gw})
		}
		t.Logf("control planes, gateway nodes and kubectl apply -k: %s", time.Since(start).Round(time.Millisecond))
		for _, c := range cs {
			c.web = runWebPod(t, c.CP, c.gw.NodeName)
			waitAgentReady(t, c)
		}
		t.Logf("agent pods Ready: %s", time.Since(start).Round(time.Millisecond))
		waitConnected(t, cs)
		t.Logf("Peers Connected: %s", time.Since(start).Round(time.Millisecond))

		t.Run("pods on the gateway nodes talk by their views", func(t *testing.T) {
			for _, from := range cs {
				for _, to := range cs {
					if from != to {
						podsTalk(t, from, to)
					}
				}
			}
		})
		t.Run("kubectl logs shows the agent's log", func(t *testing.T) {
			for _, c := range cs {
				logs := mustKubectl(t, c.CP, "-n", agentNamespace, "logs", "deployment/flotilla-agent")
				// In-cluster configuration: the service account's token,
				// the API server at KUBERNETES_SERVICE_HOST:PORT.
				for _, want := range []string{
					`"msg":"agent starting"`,
					fmt.Sprintf(`"apiServer":"https://127.0.0.1:%d"`, c.CP.Addr.Port()),
					`"msg":"agent running"`,
				} {
					if !strings.Contains(logs, want) {
						t.Errorf("kubectl logs of %s's agent lacks %s:\n%s", c.Name, want, logs)
					}
				}
				// Everything it did, it was allowed to: no grant is missing.
				for _, line := range strings.Split(logs, "\n") {
					if strings.Contains(line, "forbidden") {
						t.Errorf("%s's agent was refused something: %s", c.Name, line)
					}
				}
			}
		})
		t.Run("the agent runs with NET_ADMIN and NET_RAW only", func(t *testing.T) {
			for _, c := range cs {
				if got := agentCapabilities(t, c); got != "0000000000003000" {
					t.Errorf("agent process of %s has effective capabilities %s, want 0000000000003000 (NET_ADMIN, NET_RAW)", c.Name, got)
				}
			}
		})
		t.Run("the agent's account can do what docs/install.md lists", func(t *testing.T) {
			testAgentAccess(t, cs[0].CP)
		})
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

func federationToken(t *testing.T) string {
	key, err := discovery.GenerateFederationKey()
	if err != nil {
		t.Fatal(err)
	}
	token, err := discovery.JoinToken{Key: key}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// agentSettings are what differs from deploy/ in one test cluster.
type agentSettings struct {
	cluster, image, token, iface string
	podCIDR                      netip.Prefix
}

// writeKustomization writes a kustomization that installs deploy/
// unchanged but for the cluster's settings, and returns its directory.
func writeKustomization(t *testing.T, env *harness.Env, cp *harness.ControlPlane, gw *harness.Node, s agentSettings) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(self), "..", "..", "deploy")
	dir := filepath.Join(env.Dir, "install-"+s.cluster)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := filepath.Rel(dir, deploy)
	if err != nil {
		t.Fatal(err)
	}
	name, version, _ := strings.Cut(s.image, ":")
	files := map[string]string{
		"token": s.token,
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: ghcr.io/flotilla-io/flotilla
  newName: %s
  newTag: %s
secretGenerator:
- name: flotilla-federation
  namespace: flotilla-system
  files:
  - token
  options:
    disableNameSuffixHash: true
patches:
- path: agent.yaml
`, base, name, version),
		// The cluster's settings, and what the test machine needs:
		//   - the API server: the harness has no endpoints for the
		//     kubernetes Service (loopback cannot be one), but relays
		//     127.0.0.1:<port> into every node's namespace, which a
		//     hostNetwork pod shares; in-cluster configuration reads
		//     KUBERNETES_SERVICE_HOST and _PORT;
		//   - the state directory: /var/lib/flotilla would be one
		//     directory for every gateway node of this machine;
		//   - the WireGuard interface: wireguard-go's control socket in
		//     /run/wireguard is host-wide, so its name must be unique.
		"agent.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: flotilla-agent
  namespace: flotilla-system
spec:
  template:
    spec:
      containers:
      - name: agent
        imagePullPolicy: Never
        args:
        - agent
        - --state-dir=/var/lib/flotilla
        - --log-format=json
        - --cluster-name=%s
        - --pod-cidr=%s
        - --advertise-addr=%s
        - --wireguard-interface=%s
        - --federation-key-file=/etc/flotilla/token
        env:
        - name: KUBERNETES_SERVICE_HOST
          value: "127.0.0.1"
        - name: KUBERNETES_SERVICE_PORT
          value: "%d"
        volumeMounts:
        - name: federation
          mountPath: /etc/flotilla
          readOnly: true
      volumes:
      - name: state
        hostPath:
          path: %s
          type: DirectoryOrCreate
      - name: federation
        secret:
          secretName: flotilla-federation
`, s.cluster, s.podCIDR, gw.Addr, s.iface, cp.Addr.Port(), filepath.Join(env.Dir, "state-"+s.cluster)),
	}
	for file, content := range files {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// waitAgentReady waits until the cluster's agent pod runs on its gateway
// node and passes its readiness probe.
func waitAgentReady(t *testing.T, c *podCluster) {
	t.Helper()
	eventually.Within(t, 90*time.Second, "agent pod of "+c.Name+" Ready", func() error {
		time.Sleep(200 * time.Millisecond)
		pods, err := c.CP.Client.CoreV1().Pods(agentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: agentSelector})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d agent pods", len(pods.Items))
		}
		p := pods.Items[0]
		if p.Spec.NodeName != c.gw.NodeName {
			return fmt.Errorf("agent pod %s on node %q, want %s", p.Name, p.Spec.NodeName, c.gw.NodeName)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount > 0 {
				return fmt.Errorf("agent container restarted %d times (last: %+v)", s.RestartCount, s.LastTerminationState.Terminated)
			}
			if w := s.State.Waiting; w != nil {
				return fmt.Errorf("agent container waiting: %s: %s", w.Reason, w.Message)
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("agent pod %s %s, not Ready", p.Name, p.Status.Phase)
	})
}

// waitConnected waits until each cluster has a Connected Peer for the
// other.
func waitConnected(t *testing.T, cs []*podCluster) {
	t.Helper()
	eventually.Within(t, 90*time.Second, "Peers Connected", func() error {
		time.Sleep(100 * time.Millisecond)
		var problems []string
		for _, c := range cs {
			peers, err := c.Peers(context.Background())
			if err != nil {
				return fmt.Errorf("%s: %w", c.Name, err)
			}
			for _, o := range cs {
				if o == c {
					continue
				}
				if p, ok := peers[o.Name]; !ok {
					problems = append(problems, c.Name+" has no Peer for "+o.Name)
				} else if p.Status.Phase != v1alpha1.PhaseConnected {
					problems = append(problems, fmt.Sprintf("%s sees %s %s", c.Name, o.Name, federation.Describe(p)))
				}
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%s", strings.Join(problems, "; "))
		}
		return nil
	})
}

// agentCapabilities returns the effective capabilities (CapEff) of the
// agent's process, as the node's containerd started it.
func agentCapabilities(t *testing.T, c *podCluster) string {
	t.Helper()
	pods, err := c.CP.Client.CoreV1().Pods(agentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("agent pod of %s: %v (err %v)", c.Name, pods, err)
	}
	id := strings.TrimPrefix(pods.Items[0].Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := c.gw.Ctr(context.Background(), "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			status, err := os.ReadFile("/proc/" + f[1] + "/status")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
					return strings.TrimSpace(v)
				}
			}
		}
	}
	t.Fatalf("no task of the agent's container %s on %s's gateway:\n%s", id, c.Name, out)
	return ""
}

// podsTalk makes from's pod GET /peer of to's pod at from's view of it,
// over TCP through the tunnel; to's pod must have seen the caller at its
// own view of from's pod.
func podsTalk(t *testing.T, from, to *podCluster) {
	t.Helper()
	dst := federation.ViewOf(t, from.Cluster, to.Cluster, netip.MustParseAddr(to.web.Status.PodIP))
	want := federation.ViewOf(t, to.Cluster, from.Cluster, netip.MustParseAddr(from.web.Status.PodIP))
	url := fmt.Sprintf("http://%s:%d/peer", dst, harness.TestServerHTTPPort)
	eventually.Within(t, 30*time.Second, from.Name+" -> "+to.Name, func() error {
		out, err := kubectlAt(from.CP, "exec", from.web.Name, "--", "/testserver", "-get", url)
		if err != nil {
			time.Sleep(500 * time.Millisecond)
			return err
		}
		if seen := strings.TrimSpace(out); seen != want.String() {
			return fmt.Errorf("pod of %s (%s) reached %s's pod at %s, which saw it as %q, want %s (its view of the caller)",
				from.Name, from.web.Status.PodIP, to.Name, dst, seen, want)
		}
		return nil
	})
}

// documentedAccess is the table "Permissions, and why nothing more" of
// docs/install.md as `kubectl auth can-i --list` prints it, per
// namespace: the cluster-wide grants show in every namespace.
func documentedAccess() map[string][]string {
	cluster := []string{
		"peers.flotilla.io [] [create delete get list patch update watch]",
		"peers.flotilla.io/status [] [get patch update]",
		"nodes [] [get list watch]",
		"servicecidrs.networking.k8s.io [] [list]",
		"customresourcedefinitions.apiextensions.k8s.io [peers.flotilla.io] [create get patch update]",
	}
	events := []string{"events [] [create patch]", "events.events.k8s.io [] [create patch]"}
	ns := func(rows ...string) []string { return append(slices.Clone(cluster), rows...) }
	return map[string][]string{
		agentNamespace: ns(append(events,
			"leases.coordination.k8s.io [] [create]",
			"leases.coordination.k8s.io [flotilla-agent] [get update]")...),
		"default":     ns(events...),
		"kube-system": ns("configmaps [kubeadm-config] [get]"),
		"kube-public": ns(),
	}
}

// testAgentAccess compares what the agent's account may do, beyond what
// every service account may (the `GET /readyz` of the table is one of
// those), with docs/install.md, and has it refused a request outside it.
func testAgentAccess(t *testing.T, cp *harness.ControlPlane) {
	for ns, want := range documentedAccess() {
		granted := canIList(t, cp, ns, agentAccount)
		everyone := canIList(t, cp, ns, "system:serviceaccount:"+agentNamespace+":nobody")
		var got []string
		for _, row := range granted {
			if !slices.Contains(everyone, row) {
				got = append(got, row)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("namespace %s: the agent may\n  %s\nbeyond every service account; docs/install.md says\n  %s",
				ns, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	for _, refused := range [][]string{
		{"-n", "default", "create", "secret", "generic", "probe", "--from-literal=k=v"},
		// Not even the federation token: the pod reads it as a volume.
		{"-n", agentNamespace, "get", "secret", "flotilla-federation"},
	} {
		out, err := kubectlAt(cp, append(refused, "--as", agentAccount)...)
		if err == nil || !strings.Contains(strings.ToLower(out), "forbidden") {
			t.Errorf("kubectl %s as the agent: %v, want Forbidden:\n%s", strings.Join(refused, " "), err, out)
		}
	}
}

// canIList returns `kubectl auth can-i --list` of user in ns, one row per
// rule: "resource [names] [verbs]" or "[urls] [verbs]", verbs sorted.
func canIList(t *testing.T, cp *harness.ControlPlane, ns, user string) []string {
	t.Helper()
	out := mustKubectl(t, cp, "auth", "can-i", "--list", "-n", ns, "--as", user)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	urls, names, verbs := strings.Index(header, "Non-Resource URLs"), strings.Index(header, "Resource Names"), strings.Index(header, "Verbs")
	if urls < 0 || names < 0 || verbs < 0 {
		t.Fatalf("kubectl auth can-i --list: unexpected header %q", header)
	}
	var rows []string
	for _, line := range lines[1:] {
		line += strings.Repeat(" ", max(0, verbs-len(line)))
		v := strings.Fields(strings.Trim(strings.TrimSpace(line[verbs:]), "[]"))
		slices.Sort(v)
		resource := strings.TrimSpace(line[:urls])
		verbList := "[" + strings.Join(v, " ") + "]"
		if resource == "" {
			rows = append(rows, strings.TrimSpace(line[urls:names])+" "+verbList)
		} else {
			rows = append(rows, resource+" "+strings.TrimSpace(line[names:verbs])+" "+verbList)
		}
	}
	return rows
}

// kubectlAt runs the pinned kubectl against cp.
func kubectlAt(cp *harness.ControlPlane, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append([]string{"--kubeconfig", cp.Kubeconfig}, args...)
	out, err := exec.CommandContext(ctx, filepath.Join(harness.KubeBinDir(), "kubectl"), argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func mustKubectl(t *testing.T, cp *harness.ControlPlane, args ...string) string {
	t.Helper()
	out, err := kubectlAt(cp, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runWebPod runs a test server pod on node and returns it once Ready.
func runWebPod(t *testing.T, cp *harness.ControlPlane, node string) corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "server", Image: harness.TestServerImage, ImagePullPolicy: corev1.PullNever,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(harness.TestServerTCPPort)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod web: %v", err)
	}
	eventually.Within(t, 90*time.Second, "pod web on "+node+" Ready", func() error {
		time.Sleep(100 * time.Millisecond)
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("pod web %s %v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	return *pod
}
