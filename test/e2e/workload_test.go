package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Workload offloading across three clusters of real nodes: a consumer (a)
// and two providers that grant every peer, b labelled region=a and c
// region=b, c granting no more than 256Mi of memory. A Deployment in a
// Remote namespace runs on b and its pods look local on a: Running, with
// a's view of their addresses, reached from a's pod directly and through
// a Service's ClusterIP, with kubectl logs and exec. Then placement by
// strategy, the pod lifecycle both ways, a consumer agent killed while 50
// pods are created, and a refusal by c's quota shown on a's pod.
func TestWorkloadOffload(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 3, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		ArgsFor: func(i int) []string {
			switch i {
			case 1:
				return []string{"--offload-grants=auto", "--cluster-label=region=a"}
			case 2:
				return []string{"--offload-grants=auto", "--cluster-label=region=b"}
			}
			return nil
		},
	})
	a, b, c := cs[0], cs[1], cs[2]
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	aID := peerID(t, b, a.Name)
	bID, cID := peerID(t, a, b.Name), peerID(t, a, c.Name)
	// c grants a little memory: its LimitRange gives each pod 128Mi.
	memory := resource.MustParse("256Mi")
	changePeerSpec(t, c.Cluster, a.Name, func(s *v1alpha1.PeerSpec) {
		s.OffloadLimits = &v1alpha1.OffloadLimits{Memory: &memory}
	})
	for _, p := range []*federation.NodeCluster{b, c} {
		acceptOffloading(t, a, p.Name, "region")
		waitCondition(t, a, p.Name, v1alpha1.ConditionOffloadCredential, "Ready", 60*time.Second)
	}

	t.Run("a Ready virtual node stands for each provider", func(t *testing.T) {
		for _, p := range []struct {
			id, name, region string
		}{{bID, b.Name, "a"}, {cID, c.Name, "b"}} {
			n := waitVirtualNode(t, a, p.id, 60*time.Second)
			want := map[string]string{offload.LabelVirtualNode: "true", offload.LabelClusterID: p.id, offload.LabelClusterName: p.name, "region": p.region}
			for k, v := range want {
				if n.Labels[k] != v {
					t.Errorf("virtual node %s: label %s=%q, want %q", n.Name, k, n.Labels[k], v)
				}
			}
			if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == offload.TaintVirtualNode }) {
				t.Errorf("virtual node %s has no taint %s: %+v", n.Name, offload.TaintVirtualNode, n.Spec.Taints)
			}
		}
	})

	remote := func(ns string) string {
		r, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, ns, "", aID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	shop := remote("shop")
	createNamespace(t, a, "shop")
	offloadNamespace(t, a, "shop", "--selector", "region=a", "--pods", "Remote")

	t.Run("Remote: a Deployment's pods run on b and look local on a", func(t *testing.T) {
		federation.CreateDeployment(t, a, "shop", "web", 3, nil)
		pods := waitPods(t, a, "shop", "app=web", 3, 90*time.Second, runningOn(offload.VirtualNodeName(bID)))
		theirs := remotePods(t, b, shop, 3)
		for _, p := range pods {
			r, ok := theirs[p.Name]
			if !ok {
				t.Fatalf("no pod %s in %s on %s", p.Name, shop, b.Name)
			}
			want := federation.ViewOf(t, a.Cluster, b.Cluster, netip.MustParseAddr(r.Status.PodIP))
			if p.Status.PodIP != want.String() {
				t.Errorf("pod %s on a has IP %s, want %s (a's view of %s on %s)", p.Name, p.Status.PodIP, want, r.Status.PodIP, b.Name)
			}
			res := federation.FetchPods(t, a, a.Web, b, r)
			if res.Err != nil {
				t.Errorf("a's pod to offloaded pod %s at %s: %v", p.Name, res.Dst, res.Err)
			}
		}

		mustKubectl(t, a.CP, "-n", "shop", "expose", "deployment", "web", "--port", strconv.Itoa(harness.TestServerHTTPPort))
		svc, err := a.CP.Client.CoreV1().Services("shop").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitEndpoints(t, a, "shop", "web", podIPs(pods), 60*time.Second)
		url := fmt.Sprintf("http://%s:%d/", svc.Spec.ClusterIP, harness.TestServerHTTPPort)
		want := federation.ViewOf(t, b.Cluster, a.Cluster, netip.MustParseAddr(a.Web.Status.PodIP))
		// One of the pods on b answers, as b's API has them: an offloaded
		// pod's UID there is not its UID on a.
		backing := make([]corev1.Pod, 0, len(theirs))
		for _, r := range theirs {
			backing = append(backing, r)
		}
		// kube-proxy programs the Service a moment after its endpoints.
		eventually.Within(t, 30*time.Second, "a's pod reaches the offloaded pods through the Service "+url, func() error {
			return federation.GetAnswer(a, a.Web, url, want, b.Name, backing...)
		})
	})

	t.Run("kubectl logs and exec reach the offloaded pod", func(t *testing.T) {
		pod := waitPods(t, a, "shop", "app=web", 3, 30*time.Second, runningOn(offload.VirtualNodeName(bID)))[0]
		out, err := federation.Kubectl(a.CP, "-n", "shop", "exec", pod.Name, "--", "/testserver", "-get", fmt.Sprintf("http://127.0.0.1:%d/peer", harness.TestServerHTTPPort))
		if err != nil || strings.TrimSpace(out) != "127.0.0.1" {
			t.Errorf("kubectl exec %s: %q (err %v), want 127.0.0.1 from inside the pod on %s", pod.Name, out, err, b.Name)
		}
		// The test server logs its host name (the pod's name) first.
		ours, err := federation.Kubectl(a.CP, "-n", "shop", "logs", pod.Name)
		if err != nil || !strings.Contains(ours, pod.Name+": HTTP on") {
			t.Errorf("kubectl logs %s on a: %q (err %v), want the server's start line", pod.Name, ours, err)
		}
	})

	t.Run("placement: LocalAndRemote picks selected providers and local nodes; Local stays; contradictions are refused", func(t *testing.T) {
		createNamespace(t, a, "mixed")
		offloadNamespace(t, a, "mixed", "--selector", "region=a", "--pods", "LocalAndRemote")
		// Spread evenly over the nodes the strategy allows: a's one
		// local node and b's virtual node, two pods each. A strategy
		// that allowed only one of them would leave pods Pending (the
		// taint keeps an untolerating pod off the virtual node, which
		// the spread still counts) or put all four on it.
		vnode := offload.VirtualNodeName(bID)
		createSpreadDeployment(t, a, "mixed", "web", 4)
		pods := waitPods(t, a, "mixed", "app=web", 4, 90*time.Second, runningOnAny(vnode, a.Gateway.NodeName))
		byNode := map[string][]corev1.Pod{}
		for _, p := range pods {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
		if len(byNode[vnode]) == 0 || len(byNode[a.Gateway.NodeName]) == 0 {
			t.Fatalf("LocalAndRemote pods: %d on %s's virtual node, %d on the local node %s; want both", len(byNode[vnode]), b.Name, len(byNode[a.Gateway.NodeName]), a.Gateway.NodeName)
		}
		// Where each runs, from the provider's pod list and from who
		// answers at the pod's address on a.
		mixed := remote("mixed")
		theirs := remotePods(t, b, mixed, len(byNode[vnode]))
		for _, p := range pods {
			r, onB := theirs[p.Name]
			offloaded := p.Spec.NodeName == vnode
			switch {
			case offloaded && !onB:
				t.Errorf("pod %s is on %s's virtual node but not in %s on %s", p.Name, b.Name, mixed, b.Name)
				continue
			case !offloaded && onB:
				t.Errorf("pod %s is on the local node but also runs on %s", p.Name, b.Name)
			case offloaded:
				if origin := r.Annotations[offload.AnnotationOrigin]; origin != p.Namespace+"/"+p.Name+"/"+string(p.UID) {
					t.Errorf("pod %s on %s comes from %q, want a's pod %s", r.Name, b.Name, origin, p.Name)
				}
				if err := federation.PodReady(r); err != nil {
					t.Errorf("pod %s on %s: %v", r.Name, b.Name, err)
				}
			}
			url := fmt.Sprintf("http://%s:%d/hostname", p.Status.PodIP, harness.TestServerHTTPPort)
			out, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", url)
			if err != nil || strings.TrimSpace(out) != p.Name {
				t.Errorf("GET %s from a's pod (pod %s on %s): %q (err %v), want the pod's name", url, p.Name, p.Spec.NodeName, out, err)
			}
		}

		createNamespace(t, a, "home")
		offloadNamespace(t, a, "home", "--selector", "region=a", "--pods", "Local")
		federation.CreateDeployment(t, a, "home", "web", 2, nil)
		for _, p := range waitPods(t, a, "home", "app=web", 2, 90*time.Second, scheduled) {
			if p.Spec.NodeName != a.Gateway.NodeName {
				t.Errorf("Local pod %s on node %s, want a local node", p.Name, p.Spec.NodeName)
			}
		}

		pinned := testPod("pinned", map[string]string{"kubernetes.io/hostname": a.Gateway.NodeName})
		_, err := a.CP.Client.CoreV1().Pods("shop").Create(context.Background(), pinned, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "Remote") {
			t.Errorf("a pod pinned to a local node in a Remote namespace: %v, want a refusal naming the strategy", err)
		}
	})

	t.Run("scale down, delete out of band, delete: each side follows, nothing leaked", func(t *testing.T) {
		mustKubectl(t, a.CP, "-n", "shop", "scale", "deployment", "web", "--replicas", "2")
		waitPods(t, a, "shop", "app=web", 2, 60*time.Second, runningOn(offload.VirtualNodeName(bID)))
		theirs := remotePods(t, b, shop, 2)

		var victim corev1.Pod
		for _, p := range theirs {
			victim = p
		}
		if err := b.CP.Client.CoreV1().Pods(shop).Delete(context.Background(), victim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 60*time.Second, "the remote pod recreated on b", func() error {
			p, err := b.CP.Client.CoreV1().Pods(shop).Get(context.Background(), victim.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.UID == victim.UID {
				return fmt.Errorf("pod %s on %s not recreated yet", victim.Name, b.Name)
			}
			return nil
		})
		mine, err := a.CP.Client.CoreV1().Pods("shop").Get(context.Background(), victim.Name, metav1.GetOptions{})
		if err != nil || mine.DeletionTimestamp != nil {
			t.Errorf("a's pod %s after its remote pod was deleted out of band: %v (err %v), want it untouched", victim.Name, mine, err)
		}

		mustKubectl(t, a.CP, "-n", "shop", "delete", "deployment", "web")
		waitPods(t, a, "shop", "app=web", 0, 60*time.Second, nil)
		remotePods(t, b, shop, 0)
	})

	t.Run("the consumer's agent killed while 50 pods are created: each exists once on b", func(t *testing.T) {
		// Requests no node of b can hold: the pods exist on b but stay
		// Pending there, so 50 of them cost the machine little.
		federation.CreateDeployment(t, a, "shop", "many", 50, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")})
		eventually.Within(t, 60*time.Second, "b's first pods of many", func() error {
			n := len(listPods(t, b, shop, "app=many"))
			if n < 5 {
				return fmt.Errorf("%d pods on %s so far", n, b.Name)
			}
			return nil
		})
		restarts := killAgent(t, a)
		waitAgentRestarted(t, a, restarts)
		pods := waitPods(t, a, "shop", "app=many", 50, 90*time.Second, runningOn(offload.VirtualNodeName(bID)).orPending())
		eventually.Within(t, 90*time.Second, "every pod of many once on b", func() error {
			theirs := listPods(t, b, shop, "app=many")
			if len(theirs) != 50 {
				return fmt.Errorf("%d pods on %s, want 50", len(theirs), b.Name)
			}
			origins := map[string]int{}
			for _, p := range theirs {
				origins[p.Annotations[offload.AnnotationOrigin]]++
			}
			for _, p := range pods {
				o := p.Namespace + "/" + p.Name + "/" + string(p.UID)
				if origins[o] != 1 {
					return fmt.Errorf("a's pod %s exists %d times on %s", p.Name, origins[o], b.Name)
				}
			}
			return nil
		})
		mustKubectl(t, a.CP, "-n", "shop", "delete", "deployment", "many")
		waitPods(t, a, "shop", "app=many", 0, 90*time.Second, nil)
		remotePods(t, b, shop, 0)
	})

	t.Run("a pod over c's quota shows c's refusal", func(t *testing.T) {
		createNamespace(t, a, "tight")
		offloadNamespace(t, a, "tight", "--selector", "region=b", "--pods", "Remote")
		federation.CreateDeployment(t, a, "tight", "web", 3, nil)
		eventually.Within(t, 90*time.Second, "c's refusal shown on a", func() error {
			evs, err := a.CP.Client.CoreV1().Events("tight").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.InvolvedObject.Kind == "Pod" && strings.Contains(e.Message, "exceeded quota") {
					return nil
				}
			}
			return fmt.Errorf("no event on a's pods in tight says c's quota refused one (%d events)", len(evs.Items))
		})
	})

	t.Run("revoking the grant removes the virtual node and the remote pods", func(t *testing.T) {
		changePeerSpec(t, c.Cluster, a.Name, func(s *v1alpha1.PeerSpec) { s.Offloading = v1alpha1.OffloadingDeny })
		eventually.Within(t, 60*time.Second, "c's virtual node gone after revoke", func() error {
			_, err := a.CP.Client.CoreV1().Nodes().Get(context.Background(), offload.VirtualNodeName(cID), metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("virtual node of %s still there (err %v)", c.Name, err)
			}
			return nil
		})
		waitNamespaceGone(t, c, remote("tight"), 90*time.Second)
		// b's virtual node is untouched: the positive witness that a acted
		// on the revocation per provider.
		waitVirtualNode(t, a, bID, 5*time.Second)
	})
}

// offloadNamespace runs flotilla offload namespace and waits for Ready.
func offloadNamespace(t *testing.T, c *federation.NodeCluster, ns string, args ...string) {
	t.Helper()
	out, err := flotillaCLI(t, c, append([]string{"offload", "namespace", ns}, args...)...)
	if err != nil || !strings.Contains(out, "Ready") {
		t.Fatalf("flotilla offload namespace %s %v: %v\n%s", ns, args, err, out)
	}
}

// waitVirtualNode waits until c has a Ready virtual node for provider.
func waitVirtualNode(t *testing.T, c *federation.NodeCluster, provider string, timeout time.Duration) corev1.Node {
	t.Helper()
	var n *corev1.Node
	eventually.Within(t, timeout, "the virtual node of "+provider+" Ready on "+c.Name, func() error {
		var err error
		if n, err = c.CP.Client.CoreV1().Nodes().Get(context.Background(), offload.VirtualNodeName(provider), metav1.GetOptions{}); err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("virtual node %s not Ready: %+v", n.Name, n.Status.Conditions)
	})
	return *n
}

// testPod is a pod of the test server image.
func testPod(name string, nodeSelector map[string]string) *corev1.Pod {
	spec := federation.TestPodSpec(nil)
	spec.NodeSelector = nodeSelector
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}}, Spec: spec}
}

// podCheck says why a pod is not yet as wanted, or nil.
type podCheck func(corev1.Pod) error

func scheduled(p corev1.Pod) error {
	if p.Spec.NodeName == "" {
		return fmt.Errorf("pod %s not scheduled", p.Name)
	}
	return nil
}

// runningOn: the pod is on node, Running and Ready.
func runningOn(node string) podCheck {
	return func(p corev1.Pod) error {
		if p.Spec.NodeName != node {
			return fmt.Errorf("pod %s on node %q, want %s", p.Name, p.Spec.NodeName, node)
		}
		return federation.PodReady(p)
	}
}

// runningOnAny: the pod is on one of nodes, Running and Ready.
func runningOnAny(nodes ...string) podCheck {
	return func(p corev1.Pod) error {
		if !slices.Contains(nodes, p.Spec.NodeName) {
			return fmt.Errorf("pod %s on node %q, want one of %v", p.Name, p.Spec.NodeName, nodes)
		}
		return federation.PodReady(p)
	}
}

// createSpreadDeployment creates a Deployment of n test server pods in ns
// on c, labelled app=name, spread over the nodes they may run on with a
// skew of at most one (a pod that cannot keep it stays Pending).
func createSpreadDeployment(t *testing.T, c *federation.NodeCluster, ns, name string, n int32) {
	t.Helper()
	labels := map[string]string{"app": name}
	spec := federation.TestPodSpec(nil)
	spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
	}}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
	if _, err := c.CP.Client.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment %s/%s on %s: %v", ns, name, c.Name, err)
	}
}

// orPending also accepts a pod on the node that is Pending (its remote
// pod exists but cannot run there).
func (check podCheck) orPending() podCheck {
	return func(p corev1.Pod) error {
		if err := check(p); err != nil && !(p.Spec.NodeName != "" && p.Status.Phase == corev1.PodPending) {
			return err
		}
		return nil
	}
}

// waitPods waits until ns on c has exactly n pods matching selector, not
// being deleted, each passing check (nil: any), and returns them.
func waitPods(t *testing.T, c *federation.NodeCluster, ns, selector string, n int, timeout time.Duration, check podCheck) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	eventually.Within(t, timeout, "pods "+selector+" in "+ns+" on "+c.Name, func() error {
		pods = listPods(t, c, ns, selector)
		if len(pods) != n {
			return fmt.Errorf("%d pods %s in %s on %s, want %d", len(pods), selector, ns, c.Name, n)
		}
		for _, p := range pods {
			if check == nil {
				continue
			}
			if err := check(p); err != nil {
				return err
			}
		}
		return nil
	})
	return pods
}

// listPods lists the pods of ns on c matching selector, all of them
// (being deleted or not).
func listPods(t *testing.T, c *federation.NodeCluster, ns, selector string) []corev1.Pod {
	t.Helper()
	list, err := c.CP.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("pods of %s on %s: %v", ns, c.Name, err)
	}
	return list.Items
}

// remotePods waits until the provider p has exactly n pods in ns and
// returns them by name.
func remotePods(t *testing.T, p *federation.NodeCluster, ns string, n int) map[string]corev1.Pod {
	t.Helper()
	var byName map[string]corev1.Pod
	eventually.Within(t, 90*time.Second, "pods in "+ns+" on "+p.Name, func() error {
		byName = map[string]corev1.Pod{}
		for _, pod := range listPods(t, p, ns, "") {
			byName[pod.Name] = pod
		}
		if len(byName) != n {
			return fmt.Errorf("%d pods in %s on %s, want %d", len(byName), ns, p.Name, n)
		}
		if n == 0 {
			return nil
		}
		for _, pod := range byName {
			if pod.Status.PodIP == "" {
				return fmt.Errorf("pod %s on %s has no IP yet", pod.Name, p.Name)
			}
		}
		return nil
	})
	return byName
}

func podIPs(pods []corev1.Pod) []string {
	var ips []string
	for _, p := range pods {
		ips = append(ips, p.Status.PodIP)
	}
	slices.Sort(ips)
	return ips
}

// waitEndpoints waits until the EndpointSlices of service list exactly
// ips as ready endpoints.
func waitEndpoints(t *testing.T, c *federation.NodeCluster, ns, service string, ips []string, timeout time.Duration) {
	t.Helper()
	eventually.Within(t, timeout, "the endpoints of Service "+ns+"/"+service, func() error {
		eps, err := c.CP.Client.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err != nil {
			return err
		}
		var got []string
		for _, s := range eps.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					got = append(got, e.Addresses...)
				}
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, ips) {
			return fmt.Errorf("Service %s/%s endpoints %v, want %v", ns, service, got, ips)
		}
		return nil
	})
}

// killAgent sends SIGKILL to the agent's container on c's gateway node
// and returns the container's restart count before.
func killAgent(t *testing.T, c *federation.NodeCluster) int32 {
	t.Helper()
	pods, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: federation.AgentSelector})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("agent pod of %s: %v (err %v)", c.Name, pods, err)
	}
	st := pods.Items[0].Status.ContainerStatuses[0]
	id := strings.TrimPrefix(st.ContainerID, "containerd://")
	if out, err := c.Gateway.Ctr(context.Background(), "tasks", "kill", "--signal", "SIGKILL", id); err != nil {
		t.Fatalf("SIGKILL the agent of %s: %v\n%s", c.Name, err, out)
	}
	return st.RestartCount
}

// waitAgentRestarted waits until c's agent container restarted after
// killAgent and is Ready again.
func waitAgentRestarted(t *testing.T, c *federation.NodeCluster, before int32) {
	t.Helper()
	eventually.Within(t, 90*time.Second, "the agent of "+c.Name+" restarted and Ready", func() error {
		pods, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: federation.AgentSelector})
		if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
			return fmt.Errorf("agent pod of %s: %d (err %v)", c.Name, len(pods.Items), err)
		}
		p := pods.Items[0]
		if p.Status.ContainerStatuses[0].RestartCount <= before {
			return fmt.Errorf("the agent of %s has not restarted yet", c.Name)
		}
		return federation.PodReady(p)
	})
}
