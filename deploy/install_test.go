package deploy

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	flotillav1 "github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

const (
	namespace      = "flotilla-system"
	serviceAccount = "flotilla-agent"
	agentUser      = "system:serviceaccount:" + namespace + ":" + serviceAccount
	fabricUser     = "system:serviceaccount:" + namespace + ":flotilla-fabric"
	crdName        = "peers.flotilla.io"
	gatewayLabel   = "flotilla.io/gateway"
	agentSelector  = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"
)

var (
	crdGVR  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	peerGVR = flotillav1.GroupVersion.WithResource("peers")
)

// TestInstall applies deploy/ with kubectl to a real control plane (with a
// scheduler and three pretend nodes) and checks what an admin would see:
// the Peer API works, the agent's two replicas land on the two labelled
// nodes only, one each, a rollout never runs two agents on one node, and
// the agent's account can do what it needs and nothing more. One control
// plane serves every subtest; they run in order.
func TestInstall(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
	cp.StartKubelet("worker", harness.KubeletOptions{})
	cp.StartKubelet("gateway", harness.KubeletOptions{})
	cp.StartKubelet("gateway2", harness.KubeletOptions{})

	out, err := kubectl(cp, "apply", "--server-side", "-k", ".")
	if err != nil {
		t.Fatalf("kubectl apply -k deploy/: %v\n%s", err, out)
	}
	t.Logf("kubectl apply -k deploy/:\n%s", out)
	if out, err := kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+crdName); err != nil {
		t.Fatalf("CRD %s not Established: %v\n%s", crdName, err, out)
	}

	t.Run("kubectl get peers tells the story", func(t *testing.T) { testPeerColumns(t, cp) })
	t.Run("agent waits for the gateway label", func(t *testing.T) { testGatewayLabel(t, cp) })
	t.Run("agent pod has only NET_ADMIN", func(t *testing.T) { testPodSecurity(t, cp) })
	t.Run("rollout never runs two agents on one node", func(t *testing.T) { testRollout(t, cp) })
	t.Run("service account grants and refusals", func(t *testing.T) { testAccess(t, cp) })
	t.Run("agent requests with its own token", func(t *testing.T) { testAgentRequests(t, cp) })
	t.Run("agent installs its CRD by server-side apply", func(t *testing.T) { testCRDSelfInstall(t, cp) })
	t.Run("agent and fabric with their own tokens", func(t *testing.T) {
		// The fabric's DaemonSet passes its policy, once enforced.
		waitAgentFencesEnforced(t, cp, kubernetes.NewForConfigOrDie(agentConfig(t, cp)))
		testFabricRequests(t, cp)
	})
	t.Run("the active replica labels its own pod only", func(t *testing.T) { testGatewayRole(t, cp) })
	t.Run("agent writes its ledger's snapshot with its own token", func(t *testing.T) { testLedgerSnapshot(t, cp) })
	t.Run("kubectl delete -k removes everything", func(t *testing.T) { testUninstall(t, cp) })
}

func kubectl(cp *harness.ControlPlane, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(harness.KubeBinDir(), "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func testPeerColumns(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	peers := dynamic.NewForConfigOrDie(cp.Config).Resource(peerGVR)
	peer := &flotillav1.Peer{
		TypeMeta:   metav1.TypeMeta{APIVersion: flotillav1.GroupVersion.String(), Kind: "Peer"},
		ObjectMeta: metav1.ObjectMeta{Name: "c-beta"},
		Spec:       flotillav1.PeerSpec{Offloading: flotillav1.OffloadingGrant, Traffic: flotillav1.TrafficSegregated},
	}
	created, err := peers.Create(ctx, toUnstructured(t, peer), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Peer: %v", err)
	}
	peer.ResourceVersion = created.GetResourceVersion()
	peer.Status = flotillav1.PeerStatus{
		Phase:         flotillav1.PhaseConnected,
		ClusterName:   "beta",
		Endpoint:      "198.18.0.2:51820",
		Views:         "10.0.0.0/16=>10.70.0.0/16",
		Sources:       []string{"mdns", "seed"},
		LastHandshake: &metav1.Time{Time: time.Now().Add(-20 * time.Minute)},
		Offloading: &flotillav1.OffloadingStatus{Received: &flotillav1.GrantStatus{
			Namespace: "flotilla-tenant-c-alpha", Expires: &metav1.Time{Time: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}}},
		// The mode in effect, as the agent writes it (policy/policyapi/status.go).
		Traffic: flotillav1.TrafficSegregated,
		Allowed: &flotillav1.TrafficAllowed{Pods: 3, Services: 12},
		Conditions: []metav1.Condition{
			{Type: flotillav1.ConditionOffloadGranted, Status: metav1.ConditionTrue, Reason: "Granted", Message: "m", LastTransitionTime: metav1.Now()},
			{Type: flotillav1.ConditionOffloadCredential, Status: metav1.ConditionTrue, Reason: "Ready", Message: "m", LastTransitionTime: metav1.Now()},
		},
	}
	if _, err := peers.UpdateStatus(ctx, toUnstructured(t, peer), metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update Peer status: %v", err)
	}

	for _, tc := range []struct {
		args    []string
		columns []string
		values  []string
	}{
		{[]string{"get", "peers"}, []string{"NAME", "CLUSTER", "PHASE", "ENDPOINT", "HANDSHAKE", "HOSTING", "OFFLOAD", "AGE"}, []string{"c-beta", "beta", "Connected", "198.18.0.2:51820", "20m", "Granted", "Ready"}},
		{[]string{"get", "peers", "-o", "wide"}, []string{"NAME", "CLUSTER", "PHASE", "ENDPOINT", "HANDSHAKE", "VIEWS", "NETWORKING", "SOURCES", "OFFLOADING", "TRAFFIC", "HOSTING", "OFFLOAD", "EXPIRES", "AGE"}, []string{"10.0.0.0/16=>10.70.0.0/16", `["mdns","seed"]`, "Grant", "Segregated", "2030-01-02T03:04:05Z"}},
	} {
		out, err := kubectl(cp, tc.args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(tc.args, " "), err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl %s: want a header and one row, got:\n%s", strings.Join(tc.args, " "), out)
		}
		if header := strings.Fields(lines[0]); !slices.Equal(header, tc.columns) {
			t.Errorf("kubectl %s: columns %v, want %v", strings.Join(tc.args, " "), header, tc.columns)
		}
		row := strings.Fields(lines[1])
		for _, v := range tc.values {
			if !slices.Contains(row, v) {
				t.Errorf("kubectl %s: row %q lacks %q", strings.Join(tc.args, " "), lines[1], v)
			}
		}
	}

	// A traffic mode that does not exist is refused by the API server,
	// naming the ones that do.
	bad := peer.DeepCopy()
	bad.ObjectMeta = metav1.ObjectMeta{Name: "c-gamma"}
	bad.Status = flotillav1.PeerStatus{}
	bad.Spec.Traffic = "Partial"
	if _, err := peers.Create(ctx, toUnstructured(t, bad), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), `Unsupported value: "Partial"`) || !strings.Contains(err.Error(), `"Segregated"`) {
		t.Errorf("create Peer with spec.traffic Partial: %v; want it refused naming Full and Segregated", err)
	}
}

func toUnstructured(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatalf("convert %T: %v", obj, err)
	}
	return &unstructured.Unstructured{Object: m}
}

// agentPods lists the agent's pods that are not being deleted.
func agentPods(ctx context.Context, cp *harness.ControlPlane) ([]corev1.Pod, error) {
	list, err := cp.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// waitAgentPods waits until exactly n agent pods exist and cond holds for
// each; cond's error ends the wait at once.
func waitAgentPods(t *testing.T, cp *harness.ControlPlane, n int, what string, cond func(corev1.Pod) (bool, error)) []corev1.Pod {
	t.Helper()
	var last []corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := agentPods(ctx, cp)
		if err != nil {
			return false, nil
		}
		last = pods
		if len(pods) != n {
			return false, nil
		}
		for _, p := range pods {
			if ok, err := cond(p); !ok || err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%d agent pods %s: %v; pods: %s", n, what, err, describePods(last))
	}
	return last
}

func describePods(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "%s node=%q phase=%s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
		}
		b.WriteString("; ")
	}
	if len(pods) == 0 {
		return "none"
	}
	return b.String()
}

func unschedulable(p corev1.Pod) (bool, error) {
	if p.Spec.NodeName != "" {
		return false, fmt.Errorf("bound to node %s, which has no %s label", p.Spec.NodeName, gatewayLabel)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true, nil
		}
	}
	return false, nil
}

// The Deployment gets a ReplicaSet and two pods, which no node takes
// until one is labelled flotilla.io/gateway=true; then that node runs one
// of them, and the other waits for a second candidate node: never two on
// one node.
func testGatewayLabel(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	rs, err := cp.Client.AppsV1().ReplicaSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil || len(rs.Items) != 1 {
		t.Fatalf("ReplicaSets of the agent Deployment: %v, err %v; want one", rs, err)
	}
	pods := waitAgentPods(t, cp, 2, "unschedulable without a gateway node", unschedulable)
	for _, c := range pods[0].Status.Conditions {
		if c.Type == corev1.PodScheduled && !strings.Contains(c.Message, "node affinity/selector") {
			t.Errorf("scheduler's reason %q does not point at the node selector", c.Message)
		}
	}

	if out, err := kubectl(cp, "label", "node", "gateway", gatewayLabel+"=true"); err != nil {
		t.Fatalf("kubectl label node: %v\n%s", err, out)
	}
	running := func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }
	var pending corev1.Pod
	waitAgentPods(t, cp, 2, "one running on the gateway node, one waiting", func(p corev1.Pod) (bool, error) {
		if running(p) {
			return p.Spec.NodeName == "gateway", nil
		}
		// The node is taken: by the first replica's ports, or by
		// anti-affinity, whichever the scheduler checks first.
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable &&
				(strings.Contains(c.Message, "free ports") || strings.Contains(c.Message, "anti-affinity")) {
				pending = p
				return true, nil
			}
		}
		return false, nil
	})
	if pending.Spec.NodeName != "" {
		t.Fatalf("second replica bound to %s while the only candidate runs the first", pending.Spec.NodeName)
	}

	if out, err := kubectl(cp, "label", "node", "gateway2", gatewayLabel+"=true"); err != nil {
		t.Fatalf("kubectl label node: %v\n%s", err, out)
	}
	pods = waitAgentPods(t, cp, 2, "running on the two gateway nodes", func(p corev1.Pod) (bool, error) { return running(p), nil })
	nodes := []string{pods[0].Spec.NodeName, pods[1].Spec.NodeName}
	slices.Sort(nodes)
	if fmt.Sprint(nodes) != "[gateway gateway2]" {
		t.Fatalf("agent pods run on %v, want one on each labelled node, gateway and gateway2", nodes)
	}
}

// What the cluster runs, as the API server stored it: host network, two
// capabilities, not privileged, the host paths and probes the agent needs.
func testPodSecurity(t *testing.T, cp *harness.ControlPlane) {
	pods, err := agentPods(t.Context(), cp)
	if err != nil || len(pods) != 2 {
		t.Fatalf("agent pods: %v, err %v; want two", describePods(pods), err)
	}
	spec := pods[0].Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %s; want true, ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.ServiceAccountName != serviceAccount {
		t.Errorf("service account %q, want %q", spec.ServiceAccountName, serviceAccount)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("agent container has no securityContext with capabilities")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("agent container is privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("agent container allows privilege escalation")
	}
	if got := fmt.Sprint(sc.Capabilities.Add); got != "[NET_ADMIN]" {
		t.Errorf("added capabilities %s, want [NET_ADMIN]", got)
	}
	if got := fmt.Sprint(sc.Capabilities.Drop); got != "[ALL]" {
		t.Errorf("dropped capabilities %s, want [ALL]", got)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		mounts[v.Name] = v.HostPath.Path + " -> " + mounts[v.Name] + " (" + string(*v.HostPath.Type) + ")"
	}
	for _, want := range []string{
		"/var/lib/flotilla -> /var/lib/flotilla (DirectoryOrCreate)",
		"/dev/net/tun -> /dev/net/tun (CharDevice)",
		"/run/wireguard -> /var/run/wireguard (DirectoryOrCreate)",
	} {
		if !slices.Contains(slices.Collect(maps.Values(mounts)), want) {
			t.Errorf("host path %s not mounted; mounts: %v", want, mounts)
		}
	}
	if got := c.Resources.Limits.Memory().String(); got != "128Mi" {
		t.Errorf("memory limit %s, want 128Mi", got)
	}
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.IntValue() != 9470 {
			t.Errorf("probe %s on port 9470 missing: %+v", name, p)
		}
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g != 10 {
		t.Errorf("terminationGracePeriodSeconds %v, want 10", g)
	}
}

// A rollout (here: a changed pod template) replaces both replicas, and at
// no moment do two agent pods, terminating ones included, share a node:
// they would share its host network.
func testRollout(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	list, err := cp.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("agent pods before the rollout: %s; want two", describePods(list.Items))
	}
	w, err := cp.Client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: agentSelector, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watch agent pods: %v", err)
	}
	defer w.Stop()

	if out, err := kubectl(cp, "-n", namespace, "rollout", "restart", "deployment/flotilla-agent"); err != nil {
		t.Fatalf("kubectl rollout restart: %v\n%s", err, out)
	}
	present := map[types.UID]corev1.Pod{}
	old := map[types.UID]bool{}
	for _, p := range list.Items {
		present[p.UID], old[p.UID] = p, true
	}
	timeout := time.After(90 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch of agent pods ended early")
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				t.Fatalf("watch: %v", ev.Object)
			}
			if ev.Type == watch.Deleted {
				delete(present, pod.UID)
			} else {
				present[pod.UID] = *pod
			}
			onNode := map[string]string{}
			newRunning := 0
			for _, p := range present {
				if n := p.Spec.NodeName; n != "" {
					if other, shared := onNode[n]; shared {
						t.Fatalf("agent pods %s and %s on node %s at once during the rollout", other, p.Name, n)
					}
					onNode[n] = p.Name
				}
				if !old[p.UID] && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
					newRunning++
				}
			}
			if newRunning == 2 && len(present) == 2 {
				return
			}
		case <-timeout:
			var pods []corev1.Pod
			for _, p := range present {
				pods = append(pods, p)
			}
			t.Fatalf("the rollout did not replace both replicas within 90s; pods now: %s", describePods(pods))
		}
	}
}

// access is one question to the authorizer about the agent's account.
type access struct {
	verb, group, resource, subresource, namespace, name string
	path                                                string // non-resource URL instead
	allowed                                             bool
}

func (a access) String() string {
	if a.path != "" {
		return a.verb + " " + a.path
	}
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.name != "" {
		r += "/" + a.name
	}
	where := "cluster"
	if a.namespace != "" {
		where = "ns " + a.namespace
	}
	return fmt.Sprintf("%s %s in %s", a.verb, r, where)
}

func allow(verb, group, resource, ns, name string) access {
	return access{verb: verb, group: group, resource: resource, namespace: ns, name: name, allowed: true}
}

func deny(verb, group, resource, ns, name string) access {
	return access{verb: verb, group: group, resource: resource, namespace: ns, name: name}
}

func agentAccess() []access {
	var cases []access
	for _, v := range []string{"get", "list", "watch", "create", "update", "patch", "delete"} {
		cases = append(cases, allow(v, "flotilla.io", "peers", "", ""))
	}
	for _, v := range []string{"get", "update", "patch"} {
		a := allow(v, "flotilla.io", "peers", "", "c-beta")
		a.subresource = "status"
		cases = append(cases, a)
	}
	for _, v := range []string{"get", "list", "watch"} {
		cases = append(cases, allow(v, "", "nodes", "", ""))
	}
	for _, r := range []struct{ group, resource string }{{"crd.projectcalico.org", "blockaffinities"}, {"cilium.io", "ciliumnodes"}} {
		cases = append(cases, allow("list", r.group, r.resource, "", ""), allow("watch", r.group, r.resource, "", ""))
		for _, v := range []string{"get", "create", "update", "patch", "delete", "deletecollection"} {
			cases = append(cases, deny(v, r.group, r.resource, "", ""))
		}
	}
	// Virtual nodes: RBAC allows writing any Node and node Lease; the
	// policy flotilla-agent-virtual-nodes confines them to virtual nodes
	// (deploy/virtualnodes_test.go).
	for _, v := range []string{"create", "update", "patch", "delete"} {
		cases = append(cases, allow(v, "", "nodes", "", "flotilla-c1"))
	}
	for _, v := range []string{"update", "patch"} {
		a := allow(v, "", "nodes", "", "flotilla-c1")
		a.subresource = "status"
		cases = append(cases, a)
	}
	for _, v := range []string{"get", "create", "update", "delete"} {
		cases = append(cases, allow(v, "coordination.k8s.io", "leases", "kube-node-lease", "flotilla-c1"))
	}
	nodeProxy := deny("get", "", "nodes", "", "gateway")
	nodeProxy.subresource = "proxy"
	cases = append(cases, nodeProxy,
		deny("deletecollection", "", "nodes", "", ""),
		deny("list", "coordination.k8s.io", "leases", "kube-node-lease", ""),
		deny("deletecollection", "coordination.k8s.io", "leases", "kube-node-lease", ""))
	for _, v := range []string{"get", "create", "update", "patch"} {
		cases = append(cases, allow(v, "apiextensions.k8s.io", "customresourcedefinitions", "", crdName))
	}
	// Offloaded pods (any namespace may be offloaded) and the kubelet
	// API's checks.
	for _, v := range []string{"get", "list", "watch", "delete"} {
		cases = append(cases, allow(v, "", "pods", "shop", ""))
	}
	for _, v := range []string{"update", "patch"} {
		a := allow(v, "", "pods", "shop", "web")
		a.subresource = "status"
		cases = append(cases, a)
	}
	// The metrics port's readers are reviewed (TokenReview and
	// SubjectAccessReview); the agent is not one of them.
	cases = append(cases, allow("create", "authentication.k8s.io", "tokenreviews", "", ""),
		access{verb: "get", path: "/metrics", allowed: false})
	cases = append(cases, allow("create", "authorization.k8s.io", "subjectaccessreviews", "", ""),
		deny("update", "", "pods", "shop", "web"), deny("deletecollection", "", "pods", "shop", ""))
	// The role label on its own pods (flotilla-agent-pods narrows it to
	// that label): patch in its namespace only.
	cases = append(cases, allow("patch", "", "pods", namespace, "flotilla-agent-x"),
		deny("patch", "", "pods", "shop", "web"), deny("update", "", "pods", namespace, "flotilla-agent-x"))
	for _, ns := range []string{"default", namespace} {
		for _, g := range []string{"", "events.k8s.io"} {
			cases = append(cases, allow("create", g, "events", ns, ""), allow("patch", g, "events", ns, "x.17f"))
		}
	}
	cases = append(cases,
		allow("create", "coordination.k8s.io", "leases", namespace, ""),
		allow("get", "coordination.k8s.io", "leases", namespace, "flotilla-agent"),
		allow("update", "coordination.k8s.io", "leases", namespace, "flotilla-agent"),
		allow("watch", "coordination.k8s.io", "leases", namespace, "flotilla-agent"),
		allow("list", "coordination.k8s.io", "leases", namespace, "flotilla-agent"),
		deny("watch", "coordination.k8s.io", "leases", namespace, ""),
		// It reads the cluster's networks: ServiceCIDRs, kubeadm-config.
		allow("list", "networking.k8s.io", "servicecidrs", "", ""),
		// The pod blocks a CNI with its own IPAM records, read only;
		// nothing else of the CNIs'.
		deny("list", "crd.projectcalico.org", "ipamblocks", "", ""),
		deny("list", "cilium.io", "ciliumendpoints", "", ""),
		allow("get", "", "configmaps", "kube-system", "kubeadm-config"),
		// The agent probes its API server's readiness.
		access{verb: "get", path: "/readyz", allowed: true},
		// The fabric: its own Deployment, the fabric's DaemonSet and plan.
		allow("get", "apps", "deployments", namespace, "flotilla-agent"),
		allow("get", "apps", "daemonsets", namespace, "flotilla-fabric"),
		allow("create", "apps", "daemonsets", namespace, "flotilla-fabric"),
		allow("patch", "apps", "daemonsets", namespace, "flotilla-fabric"),
		allow("get", "", "configmaps", namespace, "flotilla-fabric"),
		allow("create", "", "configmaps", namespace, "flotilla-fabric"),
		allow("patch", "", "configmaps", namespace, "flotilla-fabric"),
		// Key rotation: the keyring it follows, the status it writes.
		allow("watch", "", "secrets", namespace, "flotilla-federation"),
		allow("list", "", "secrets", namespace, "flotilla-federation"),
		allow("get", "", "configmaps", namespace, "flotilla-federation-keys"),
		allow("create", "", "configmaps", namespace, "flotilla-federation-keys"),
		allow("patch", "", "configmaps", namespace, "flotilla-federation-keys"),
	)

	// Grants (docs/offload.md): tenant namespaces and the objects in them.
	// RBAC allows these anywhere; the policies of admission.yaml confine
	// them to tenant namespaces (deploy/grants_test.go).
	for _, v := range []string{"get", "list", "watch", "create", "patch", "delete"} {
		cases = append(cases, allow(v, "", "namespaces", "", ""))
	}
	for _, v := range []string{"get", "create", "patch", "delete"} {
		cases = append(cases,
			allow(v, "", "serviceaccounts", tenant, "flotilla-consumer"),
			allow(v, "rbac.authorization.k8s.io", "rolebindings", tenant, "flotilla-consumer"),
			allow(v, "", "resourcequotas", tenant, "flotilla-grant"),
			allow(v, "", "limitranges", tenant, "flotilla-grant"),
			allow(v, "networking.k8s.io", "networkpolicies", tenant, "flotilla-fence"))
	}
	for _, v := range []string{"list", "watch"} {
		cases = append(cases, allow(v, "networking.k8s.io", "networkpolicies", "", ""))
	}
	for _, v := range []string{"create", "patch", "delete"} {
		cases = append(cases, allow(v, "", "secrets", tenant, "flotilla-grant"))
	}
	// Namespace mirroring: it answers the consumers' requests.
	for _, v := range []string{"get", "list", "watch", "update", "patch"} {
		cases = append(cases, allow(v, "flotilla.io", "namespacerequests", "", ""))
	}
	for _, v := range []string{"get", "update", "patch"} {
		a := allow(v, "flotilla.io", "namespacerequests", tenant, "shop-q3x7bd")
		a.subresource = "status"
		cases = append(cases, a)
	}
	cases = append(cases, deny("create", "flotilla.io", "namespacerequests", tenant, ""),
		deny("delete", "flotilla.io", "namespacerequests", tenant, "shop-q3x7bd"))
	// Placement and the kubelet API: the one webhook configuration, a CA Secret each.
	for _, v := range []string{"get", "list", "watch", "create", "patch", "delete"} {
		cases = append(cases, allow(v, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "flotilla-placement"))
	}
	for _, v := range []string{"get", "create", "patch"} {
		cases = append(cases, allow(v, "", "secrets", namespace, "flotilla-placement-ca"),
			allow(v, "", "secrets", namespace, "flotilla-kubelet-ca"),
			allow(v, "", "secrets", namespace, "flotilla-join"))
	}
	// The ledger's snapshot (docs/ha.md): that Secret alone, in its namespace.
	// (A patch elsewhere passes RBAC, by the grant's Secret rule, and is
	// refused by admission: testLedgerSnapshot.)
	for _, v := range []string{"get", "update", "patch"} {
		cases = append(cases, allow(v, "", "secrets", namespace, "flotilla-ledger"))
	}
	for _, v := range []string{"get", "update"} {
		cases = append(cases, deny(v, "", "secrets", "default", "flotilla-ledger"))
	}
	cases = append(cases, deny("update", "", "secrets", namespace, "flotilla-federation"),
		deny("get", "", "secrets", namespace, "flotilla-ledger-other"))
	cases = append(cases,
		deny("list", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""),
		deny("create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""),
		deny("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "other"),
		deny("delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "other"),
		deny("create", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "flotilla-placement"),
		deny("patch", "admissionregistration.k8s.io", "validatingadmissionpolicies", "", "flotilla-agent-namespaces"),
		// It reads the policies and their bindings to prove them in force,
		// and may change none.
		allow("list", "admissionregistration.k8s.io", "validatingadmissionpolicies", "", ""),
		allow("list", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", ""),
		allow("watch", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", ""),
		deny("delete", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", "flotilla-agent-namespaces"),
		deny("create", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", ""),
		allow("get", "", "secrets", namespace, "flotilla-federation"),
		deny("get", "", "secrets", "default", "flotilla-placement-ca"),
		deny("list", "", "secrets", namespace, "flotilla-placement-ca"),
		deny("get", "", "secrets", "default", "flotilla-kubelet-ca"),
	)
	consumerToken := allow("create", "", "serviceaccounts", tenant, "flotilla-consumer")
	consumerToken.subresource = "token"
	otherToken := deny("create", "", "serviceaccounts", tenant, "default")
	otherToken.subresource = "token"
	cases = append(cases, consumerToken, otherToken,
		allow("bind", "rbac.authorization.k8s.io", "clusterroles", tenant, "flotilla-consumer"),
		deny("bind", "rbac.authorization.k8s.io", "clusterroles", tenant, "admin"),
		deny("bind", "rbac.authorization.k8s.io", "roles", tenant, ""),
		deny("escalate", "rbac.authorization.k8s.io", "clusterroles", "", "flotilla-consumer"),
		deny("create", "rbac.authorization.k8s.io", "roles", tenant, ""),
		deny("update", "", "namespaces", "", "default"),
		deny("deletecollection", "", "namespaces", "", ""),
		deny("update", "", "secrets", tenant, "flotilla-grant"),
		// Write only: it never reads the grant's Secret back.
		deny("get", "", "secrets", tenant, "flotilla-grant"),
		deny("watch", "", "secrets", tenant, ""),
		deny("list", "", "serviceaccounts", tenant, ""),
		deny("create", "", "pods", tenant, ""),
		// The API server address it announces.
		allow("get", "", "configmaps", "kube-public", "cluster-info"),
		deny("get", "", "configmaps", "kube-public", "other"),
		deny("list", "", "configmaps", "kube-public", ""),
		allow("get", "discovery.k8s.io", "endpointslices", "default", "kubernetes"),
		allow("get", "discovery.k8s.io", "endpointslices", "default", "other"),
		allow("get", "", "services", "default", "kubernetes"),
		// Multi-Cluster Services (docs/services.md): any Service may be
		// exported, and imports land in the users' namespaces; the policy
		// flotilla-agent-service-objects confines the writes to its own.
		allow("list", "discovery.k8s.io", "endpointslices", "default", ""),
		allow("get", "", "services", "default", "other"),
		allow("list", "multicluster.x-k8s.io", "serviceexports", "default", ""),
		deny("create", "multicluster.x-k8s.io", "serviceexports", "default", ""),
		deny("delete", "multicluster.x-k8s.io", "serviceexports", "default", "other"),
		allow("create", "multicluster.x-k8s.io", "serviceimports", "default", ""),
		allow("create", "about.k8s.io", "clusterproperties", "", ""),
		deny("delete", "about.k8s.io", "clusterproperties", "", "cluster.clusterset.k8s.io"),
		// The clusterset DNS reads the imported EndpointSlices and the
		// ServiceImports.
		allow("watch", "discovery.k8s.io", "endpointslices", "", ""),
		allow("list", "multicluster.x-k8s.io", "serviceimports", "", ""),
		allow("watch", "multicluster.x-k8s.io", "serviceimports", "", ""),
	)

	// Refusals: everything docs/install.md says the agent may not do, and
	// the likely escapes.
	// Reflection reads ConfigMaps and Secrets only in offloaded
	// namespaces, through a RoleBinding made there when the namespace is
	// offloaded (deploy/reflection.yaml, docs/services.md); deploy/ binds
	// it nowhere.
	for _, ns := range []string{"", "default", namespace, "kube-system", "shop"} {
		for _, v := range []string{"get", "list", "watch"} {
			cases = append(cases, deny(v, "", "secrets", ns, ""), deny(v, "", "configmaps", ns, ""))
		}
	}
	cases = append(cases,
		deny("bind", "rbac.authorization.k8s.io", "clusterroles", "shop", "flotilla-agent-reflection"),
		deny("escalate", "rbac.authorization.k8s.io", "clusterroles", "", "flotilla-agent-reflection"))
	saToken := deny("create", "", "serviceaccounts", namespace, serviceAccount)
	saToken.subresource = "token"
	cases = append(cases,
		deny("create", "", "pods", namespace, ""),
		deny("create", "", "pods", "default", ""),
		deny("get", "", "configmaps", "kube-system", "kube-proxy"),
		allow("get", "", "configmaps", "kube-system", "extension-apiserver-authentication"),
		allow("watch", "", "configmaps", "kube-system", "extension-apiserver-authentication"),
		deny("update", "", "configmaps", "kube-system", "kubeadm-config"),
		saToken,
		deny("deletecollection", "flotilla.io", "peers", "", ""),
		// CRDs: only peers.flotilla.io, never deleted, a create only by name.
		deny("patch", "apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.example.com"),
		deny("update", "apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.example.com"),
		deny("get", "apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.example.com"),
		deny("create", "apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.example.com"),
		deny("create", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
		deny("list", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
		deny("delete", "apiextensions.k8s.io", "customresourcedefinitions", "", crdName),
		// No way to widen its own grants.
		deny("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""),
		deny("update", "rbac.authorization.k8s.io", "clusterroles", "", "flotilla-agent"),
		deny("escalate", "rbac.authorization.k8s.io", "clusterroles", "", ""),
		deny("bind", "rbac.authorization.k8s.io", "clusterroles", "", "cluster-admin"),
		deny("impersonate", "", "users", "", "admin"),
		deny("impersonate", "", "groups", "", "system:masters"),
		deny("impersonate", "", "serviceaccounts", "kube-system", "default"),
		deny("impersonate", "authentication.k8s.io", "userextras", "", "scopes"),
		// Events and leases only where granted.
		// Events on offloaded pods, wherever they are.
		allow("create", "", "events", "kube-system", ""),
		deny("update", "coordination.k8s.io", "leases", "kube-system", "kube-controller-manager"),
		deny("update", "coordination.k8s.io", "leases", namespace, "someone-else"),
		deny("delete", "coordination.k8s.io", "leases", namespace, "flotilla-agent"),
		// The fabric's objects only, only in its namespace; no other
		// workload, no way to change its own Deployment.
		deny("create", "apps", "daemonsets", namespace, ""),
		deny("create", "apps", "daemonsets", "kube-system", "flotilla-fabric"),
		deny("patch", "apps", "daemonsets", namespace, "kube-proxy"),
		deny("delete", "apps", "daemonsets", namespace, "flotilla-fabric"),
		deny("patch", "apps", "deployments", namespace, "flotilla-agent"),
		deny("create", "apps", "deployments", namespace, ""),
		deny("list", "apps", "deployments", namespace, ""),
		deny("create", "", "configmaps", namespace, ""),
		deny("patch", "", "configmaps", namespace, "other"),
		deny("get", "", "configmaps", namespace, "other"),
	)
	return cases
}

// fabricAccess is what the fabric's pods may do, and what they may not.
func fabricAccess() []access {
	return []access{
		allow("get", "", "configmaps", namespace, "flotilla-fabric"),
		allow("list", "", "configmaps", namespace, "flotilla-fabric"),
		allow("watch", "", "configmaps", namespace, "flotilla-fabric"),
		allow("get", "apps", "daemonsets", namespace, "flotilla-fabric"),
		// Its metrics port's readers are reviewed.
		allow("create", "authentication.k8s.io", "tokenreviews", "", ""),
		allow("create", "authorization.k8s.io", "subjectaccessreviews", "", ""),
		deny("list", "", "configmaps", namespace, ""),
		deny("get", "", "configmaps", namespace, "other"),
		deny("patch", "", "configmaps", namespace, "flotilla-fabric"),
		deny("patch", "apps", "daemonsets", namespace, "flotilla-fabric"),
		deny("list", "", "nodes", "", ""),
		deny("get", "", "secrets", namespace, ""),
		deny("list", "flotilla.io", "peers", "", ""),
		deny("create", "", "pods", namespace, ""),
	}
}

// ask puts the question to the API server's authorizer as user (a service
// account), with the groups its token carries.
func (a access) ask(ctx context.Context, kube kubernetes.Interface, user string) (bool, string, error) {
	ns, _, _ := strings.Cut(strings.TrimPrefix(user, "system:serviceaccount:"), ":")
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}}
	if a.path != "" {
		sar.Spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Verb: a.verb, Path: a.path}
	} else {
		sar.Spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
			Namespace: a.namespace, Name: a.name,
		}
	}
	res, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	return res.Status.Allowed, res.Status.Reason, nil
}

// Every grant and refusal, asked of the real authorizer as the agent's
// service account with the groups its token carries.
func testAccess(t *testing.T, cp *harness.ControlPlane) {
	for user, cases := range map[string][]access{agentUser: agentAccess(), fabricUser: fabricAccess()} {
		for _, tc := range cases {
			t.Run(user+" "+tc.String(), func(t *testing.T) {
				allowed, reason, err := tc.ask(t.Context(), cp.Client, user)
				if err != nil {
					t.Fatalf("SubjectAccessReview: %v", err)
				}
				if allowed != tc.allowed {
					t.Errorf("%s as %s: allowed=%v (%s), want %v", tc, user, allowed, reason, tc.allowed)
				}
			})
		}
	}
}

// The agent's own token, as the pod would get it: it creates a Peer and
// writes its status, and is refused what it was not granted.
func testAgentRequests(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	cfg := agentConfig(t, cp)
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	peer := &flotillav1.Peer{
		TypeMeta:   metav1.TypeMeta{APIVersion: flotillav1.GroupVersion.String(), Kind: "Peer"},
		ObjectMeta: metav1.ObjectMeta{Name: "c-gamma"},
	}
	obj, err := dyn.Resource(peerGVR).Create(ctx, toUnstructured(t, peer), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("agent creates a Peer: %v", err)
	}
	if err := unstructured.SetNestedField(obj.Object, string(flotillav1.PhaseNegotiating), "status", "phase"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(peerGVR).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("agent updates a Peer's status: %v", err)
	}
	if _, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("agent lists nodes: %v", err)
	}
	if _, err := dyn.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{}); err != nil {
		t.Fatalf("agent reads its CRD: %v", err)
	}

	other := crdObject(t)
	other.SetName("widgets.example.com")
	if err := unstructured.SetNestedField(other.Object, "example.com", "spec", "group"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedMap(other.Object, map[string]any{"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"}, "spec", "names"); err != nil {
		t.Fatal(err)
	}
	refusals := []struct {
		what string
		do   func() error
	}{
		// It reads Secrets and ConfigMaps only in offloaded namespaces
		// (reflection), and writes them nowhere but its own.
		{"create a secret in kube-system", func() error {
			_, err := kube.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "escape"}}, metav1.CreateOptions{})
			return err
		}},
		{"read a Secret in kube-system", func() error {
			_, err := kube.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-abcdef", metav1.GetOptions{})
			return err
		}},
		{"list Secrets cluster-wide", func() error {
			_, err := kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list ConfigMaps in default", func() error {
			_, err := kube.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"delete configmaps in kube-system", func() error {
			return kube.CoreV1().ConfigMaps("kube-system").Delete(ctx, "kube-proxy", metav1.DeleteOptions{})
		}},
		{"create a pod", func() error {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "escape", Namespace: namespace},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
			}
			_, err := kube.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
			return err
		}},
		{"delete a node", func() error { return kube.CoreV1().Nodes().Delete(ctx, "worker", metav1.DeleteOptions{}) }},
		{"create another CRD", func() error { _, err := dyn.Resource(crdGVR).Create(ctx, other, metav1.CreateOptions{}); return err }},
		{"apply another CRD", func() error {
			_, err := dyn.Resource(crdGVR).Apply(ctx, other.GetName(), other, metav1.ApplyOptions{FieldManager: "flotilla-agent", Force: true})
			return err
		}},
		{"delete its CRD", func() error { return dyn.Resource(crdGVR).Delete(ctx, crdName, metav1.DeleteOptions{}) }},
		// It reads a CNI's block affinities, never writes one.
		{"create a Calico BlockAffinity", func() error {
			_, err := dyn.Resource(blockAffinityGVR).Create(ctx, blockAffinity(), metav1.CreateOptions{})
			return err
		}},
	}
	// The list is allowed: the API server, which does not serve the kind
	// here, answers NotFound rather than Forbidden.
	if _, err := dyn.Resource(blockAffinityGVR).List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("agent lists Calico's BlockAffinities (not installed): got %v, want NotFound", err)
	}
	// RBAC lets the agent delete Nodes; the policy that keeps it to
	// virtual nodes is loaded in the background.
	eventually.Within(t, 30*time.Second, "policy flotilla-agent-virtual-nodes enforced", func() error {
		err := kube.CoreV1().Nodes().Delete(ctx, "worker", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "'flotilla-agent-virtual-nodes'") {
			return fmt.Errorf("dry-run delete of node worker: %v", err)
		}
		return nil
	})
	for _, r := range refusals {
		if err := r.do(); !apierrors.IsForbidden(err) {
			t.Errorf("agent may %s: got %v, want Forbidden", r.what, err)
		}
	}
	if _, err := cp.Client.CoreV1().Nodes().Get(ctx, "worker", metav1.GetOptions{}); err != nil {
		t.Errorf("node worker after the refused delete: %v", err)
	}
}

var blockAffinityGVR = schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "blockaffinities"}

func blockAffinity() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
		"metadata": map[string]any{"name": "w1-10-0-9-0-26"},
		"spec":     map[string]any{"cidr": "10.0.9.0/26", "node": "w1", "state": "confirmed"},
	}}
}

// agentConfig returns a client config holding a token of the agent's
// service account from the TokenRequest API, as a pod gets one.
func agentConfig(t *testing.T, cp *harness.ControlPlane) *rest.Config {
	t.Helper()
	return tokenConfig(t, cp, serviceAccount)
}

// tokenConfig is agentConfig for any service account of the namespace.
func tokenConfig(t *testing.T, cp *harness.ControlPlane, account string) *rest.Config {
	t.Helper()
	expiry := int64(600)
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for service account %s/%s: %v", namespace, account, err)
	}
	return &rest.Config{
		Host:            cp.Config.Host,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.Config.CAData},
	}
}

func crdObject(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	data, err := CRDs.ReadFile("crds/flotilla.io_peers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("crds/flotilla.io_peers.yaml: %v", err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(js); err != nil {
		t.Fatalf("crds/flotilla.io_peers.yaml: %v", err)
	}
	return obj
}

// With the CRD gone (a fresh cluster), the agent's account installs it
// from the embedded copy by server-side apply, the one create its role
// allows, and the Peer API comes back.
func testCRDSelfInstall(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	admin := dynamic.NewForConfigOrDie(cp.Config).Resource(crdGVR)
	if err := admin.Delete(ctx, crdName, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete CRD: %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := admin.Get(ctx, crdName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("CRD %s still there after delete: %v", crdName, err)
	}

	agent := dynamic.NewForConfigOrDie(agentConfig(t, cp)).Resource(crdGVR)
	if _, err := agent.Create(ctx, crdObject(t), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("agent creates its CRD with a plain create: got %v, want Forbidden", err)
	}
	if _, err := agent.Apply(ctx, crdName, crdObject(t), metav1.ApplyOptions{FieldManager: "flotilla-agent", Force: true}); err != nil {
		t.Fatalf("agent applies its CRD: %v", err)
	}
	if out, err := kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+crdName); err != nil {
		t.Fatalf("CRD %s applied by the agent not Established: %v\n%s", crdName, err, out)
	}
	// Applying again is the upgrade path: a patch of that one name.
	if _, err := agent.Apply(ctx, crdName, crdObject(t), metav1.ApplyOptions{FieldManager: "flotilla-agent", Force: true}); err != nil {
		t.Fatalf("agent re-applies its CRD: %v", err)
	}
	if out, err := kubectl(cp, "get", "peers"); err != nil || !strings.Contains(out, "No resources found") {
		t.Fatalf("kubectl get peers after the agent installed the CRD: %v\n%s", err, out)
	}
}

// Uninstalling removes every object deploy/ made, waits for the namespace
// to finalize, and leaves what it did not make (the default namespace).
func testUninstall(t *testing.T, cp *harness.ControlPlane) {
	if out, err := kubectl(cp, "delete", "-k", ".", "--wait", "--timeout=90s"); err != nil {
		t.Fatalf("kubectl delete -k deploy/: %v\n%s", err, out)
	}
	for _, obj := range []string{
		"namespace/" + namespace,
		"crd/" + crdName,
		"clusterrole/flotilla-agent",
		"clusterrolebinding/flotilla-agent",
		"-n default role/flotilla-agent-events",
		"-n default rolebinding/flotilla-agent-events",
		"-n default role/flotilla-agent-api-server",
		"-n kube-public rolebinding/flotilla-agent-api-server",
		"clusterrole/flotilla-consumer",
		"validatingadmissionpolicy/flotilla-agent-namespaces",
		"validatingadmissionpolicy/flotilla-agent-virtual-nodes",
		"-n kube-node-lease role/flotilla-agent-node-leases",
		"validatingadmissionpolicybinding/flotilla-consumer-pods",
	} {
		out, err := kubectl(cp, append([]string{"get"}, strings.Fields(obj)...)...)
		if err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("%s after uninstall: %v\n%s", obj, err, out)
		}
	}
	if out, err := kubectl(cp, "get", "namespace", "default"); err != nil {
		t.Errorf("namespace default after uninstall: %v\n%s", err, out)
	}
}
