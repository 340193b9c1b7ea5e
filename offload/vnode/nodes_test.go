package vnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/test/harness"
)

// vnEnv is a real control plane, whose controller manager runs the node
// lifecycle controller on every Node, and Nodes running against
// it. Peers and their status are written by the test, as the peering and
// remote.Consumer would.
type vnEnv struct {
	cp    *harness.ControlPlane
	admin client.Client
	creds *offloadtest.Credentials
	reg   *prometheus.Registry
	addr  netip.Addr
	port  int32
}

// TestVirtualNode runs Nodes against a real control plane; the
// subtests run in order, each with providers of its own. The node
// lifecycle controller needs its grace period (50 s) to act on a Node, so
// the Node it is tested on is made first and checked last.
func TestVirtualNode(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp1", harness.ControlPlaneOptions{})
	offloadtest.MustApplyCRDs(t, cp.Config)
	e := &vnEnv{cp: cp, admin: offloadtest.AdminClient(t, cp), reg: prometheus.NewRegistry(),
		creds: &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{}},
		addr:  netip.MustParseAddr("192.0.2.10"), port: 10260}
	e.start(t)

	steady := e.addPeer(t, "steady", nil, grant.Limits{})
	// A new Node carries node.kubernetes.io/not-ready until the node
	// lifecycle controller has seen it Ready (the API server's
	// TaintNodesByCondition admission puts it there): watched from then on.
	n := e.waitNode(t, steady, "Ready and untainted", func(n *corev1.Node) error {
		if err := readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, "")(n); err != nil {
			return err
		}
		if hasTaint(n, corev1.TaintNodeNotReady) {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		return nil
	})
	lapses := e.watchLapses(t, n)
	witness := e.createWitnessNode(t)

	t.Run("node has the provider's labels, taint, capacity and address", e.testNode)
	t.Run("capacity and labels follow the grant and the Peer", e.testFollows)
	t.Run("lease renewed", e.testLease)
	t.Run("Ready follows the peering and the credential", e.testReady)
	t.Run("node and lease removed with the grant", e.testRemoved)
	t.Run("a foreign node of our name is left alone", e.testForeign)
	t.Run("node lifecycle controller leaves a Ready virtual node alone", func(t *testing.T) { e.testLifecycle(t, steady, witness, lapses) })
}

func (e *vnEnv) start(t *testing.T) {
	t.Helper()
	vn, err := NewNodes(Config{
		Config: e.cp.Config, Credentials: e.creds, Address: e.addr, KubeletPort: e.port,
		Logger:  slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: e.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	offloadtest.RunUntilCleanup(t, "vnode.Nodes.Run", vn.Run)
}

// addPeer writes a provider's Peer, Connected, with a working credential
// granted with limits, as the peering and remote.Consumer write it; it
// returns the provider's cluster ID.
func (e *vnEnv) addPeer(t *testing.T, name string, labels map[string]string, limits grant.Limits) string {
	t.Helper()
	id := offloadtest.NewConsumer(t)
	e.setGrant(id, limits)
	if err := e.admin.Create(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: labels}}); err != nil {
		t.Fatal(err)
	}
	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) {
		st.Phase, st.ClusterName = v1alpha1.PhaseConnected, name
		st.Offloading = &v1alpha1.OffloadingStatus{Received: &v1alpha1.GrantStatus{Namespace: offload.TenantNamespace("cself"), Limits: offload.LimitsStatus(limits)}}
		setCredentialCondition(st, true, "Ready", "a working credential")
	})
	return id
}

func (e *vnEnv) setGrant(id string, limits grant.Limits) {
	e.creds.Set(id, remote.ProviderCredential{
		Config: &rest.Config{Host: "https://192.0.2.1:6443"},
		Grant:  grant.Grant{Provider: id, Limits: limits, ExpiresAt: time.Now().Add(time.Hour)},
	})
}

func setCredentialCondition(st *v1alpha1.PeerStatus, ok bool, reason, message string) {
	c := metav1.Condition{Type: v1alpha1.ConditionOffloadCredential, Status: metav1.ConditionFalse, Reason: reason, Message: message}
	if ok {
		c.Status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, c)
}

// setStatus changes Peer id's status.
func (e *vnEnv) setStatus(t *testing.T, id string, change func(*v1alpha1.PeerStatus)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p v1alpha1.Peer
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: id}, &p); err != nil {
			return err
		}
		change(&p.Status)
		return e.admin.Status().Update(t.Context(), &p)
	})
	if err != nil {
		t.Fatalf("status of Peer %s: %v", id, err)
	}
}

func (e *vnEnv) setLabels(t *testing.T, id string, labels map[string]string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p v1alpha1.Peer
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: id}, &p); err != nil {
			return err
		}
		p.Labels = labels
		return e.admin.Update(t.Context(), &p)
	})
	if err != nil {
		t.Fatalf("labels of Peer %s: %v", id, err)
	}
}

// waitNode waits until provider id's virtual node satisfies check.
func (e *vnEnv) waitNode(t *testing.T, id, what string, check func(*corev1.Node) error) *corev1.Node {
	t.Helper()
	var n *corev1.Node
	eventually.Within(t, 30*time.Second, "virtual node of "+id+": "+what, func() error {
		var err error
		if n, err = e.cp.Client.CoreV1().Nodes().Get(t.Context(), offload.VirtualNodeName(id), metav1.GetOptions{}); err != nil {
			return err
		}
		return check(n)
	})
	return n
}

func readyIs(status corev1.ConditionStatus, reason, inMessage string) func(*corev1.Node) error {
	return func(n *corev1.Node) error {
		c := nodeCondition(n, corev1.NodeReady)
		if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, inMessage) {
			return fmt.Errorf("Ready condition %+v, want %s %s with %q", c, status, reason, inMessage)
		}
		return nil
	}
}

func (e *vnEnv) lease(t *testing.T, id string) (*coordinationv1.Lease, error) {
	t.Helper()
	return e.cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), offload.VirtualNodeName(id), metav1.GetOptions{})
}

// metric is the value of a series of the registry; false when there is
// none.
func (e *vnEnv) metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func resources(cpu, memory, pods string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory), corev1.ResourcePods: resource.MustParse(pods)}
}

func capacityIs(want corev1.ResourceList) func(*corev1.Node) error {
	return func(n *corev1.Node) error {
		for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
			if len(l) != len(want) || !sameCapacity(l, want) {
				return fmt.Errorf("capacity %s, allocatable %s; want %s", resourcesString(n.Status.Capacity), resourcesString(n.Status.Allocatable), resourcesString(want))
			}
		}
		return nil
	}
}

// The Node stands for the provider: its labels say which (and carry its
// cluster labels, not those of reserved domains), our taint keeps pods
// off it, its capacity is the grant's limits (defaults where none), the
// API server reaches it at the agent's address.
func (e *vnEnv) testNode(t *testing.T) {
	id := e.addPeer(t, "shop-eu", map[string]string{
		"region": "eu", "topology.kubernetes.io/zone": "z1", "flotilla.io/gateway": "true", offload.LabelVirtualNode: "false",
	}, grant.Limits{CPU: "4", Memory: "8Gi", Pods: 20})
	unlimited := e.addPeer(t, "shop-us", nil, grant.Limits{})

	n := e.waitNode(t, id, "Ready", readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, "shop-eu"))
	name := offload.VirtualNodeName(id)
	for k, want := range map[string]string{
		offload.LabelVirtualNode: "true", offload.LabelClusterID: id, offload.LabelClusterName: "shop-eu", "app.kubernetes.io/managed-by": "flotilla",
		"region": "eu", corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH,
	} {
		if got, ok := n.Labels[k]; !ok || got != want {
			t.Errorf("label %s = %q (%v), want %q", k, got, ok, want)
		}
	}
	if o := n.OwnerReferences; len(o) != 1 || o[0].Kind != "Peer" || o[0].Name != id || o[0].UID == "" {
		t.Errorf("owner references %+v, want the Peer %s (deleted with it on uninstall)", o, id)
	}
	for _, k := range []string{"topology.kubernetes.io/zone", "flotilla.io/gateway"} {
		if _, ok := n.Labels[k]; ok {
			t.Errorf("label %s of a reserved domain copied from the Peer: %v", k, n.Labels)
		}
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool {
		return tt.Key == offload.TaintVirtualNode && tt.Value == "true" && tt.Effect == corev1.TaintEffectNoExecute
	}) {
		t.Errorf("taints %v lack %s=true:NoExecute", n.Spec.Taints, offload.TaintVirtualNode)
	}
	if err := capacityIs(resources("4", "8Gi", "20"))(n); err != nil {
		t.Error(err)
	}
	wantAddrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeHostName, Address: name}}
	if !slices.Equal(n.Status.Addresses, wantAddrs) {
		t.Errorf("addresses %v, want %v", n.Status.Addresses, wantAddrs)
	}
	if got := n.Status.DaemonEndpoints.KubeletEndpoint.Port; got != e.port {
		t.Errorf("kubelet port %d, want %d", got, e.port)
	}
	server, err := e.cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	info := n.Status.NodeInfo
	if info.OperatingSystem != "linux" || info.Architecture != runtime.GOARCH || info.KubeletVersion != server.GitVersion+"-flotilla" {
		t.Errorf("node info %+v; want linux, %s, kubelet %s-flotilla", info, runtime.GOARCH, server.GitVersion)
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		if got := nodeCondition(n, c); got == nil || got.Status != corev1.ConditionFalse {
			t.Errorf("condition %s: %+v, want False", c, got)
		}
	}
	eventually.Within(t, 30*time.Second, "flotilla_virtual_node_ready 1", func() error {
		if v, ok := e.metric(t, "flotilla_virtual_node_ready", map[string]string{"peer": id}); !ok || v != 1 {
			return fmt.Errorf("flotilla_virtual_node_ready{peer=%s} = %v (%v)", id, v, ok)
		}
		return nil
	})

	e.waitNode(t, unlimited, "capacity without limits", capacityIs(resources("1000", "4Ti", "10000")))
}

// A new grant's limits change the capacity; the Peer's labels changing
// change the node's, and a label an admin put on the node stays.
func (e *vnEnv) testFollows(t *testing.T) {
	id := e.addPeer(t, "shop-eu", map[string]string{"region": "eu"}, grant.Limits{CPU: "4", Memory: "8Gi", Pods: 20})
	e.waitNode(t, id, "first capacity", capacityIs(resources("4", "8Gi", "20")))
	name := offload.VirtualNodeName(id)
	if _, err := e.cp.Client.CoreV1().Nodes().Patch(t.Context(), name, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"ops"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	limits := grant.Limits{CPU: "8", Memory: "16Gi"}
	e.setGrant(id, limits)
	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) { st.Offloading.Received.Limits = offload.LimitsStatus(limits) })
	e.waitNode(t, id, "capacity of the new limits", capacityIs(resources("8", "16Gi", "10000")))

	e.setLabels(t, id, map[string]string{"tier": "gold"})
	e.waitNode(t, id, "labels of the Peer", func(n *corev1.Node) error {
		if _, ok := n.Labels["region"]; ok || n.Labels["tier"] != "gold" || n.Labels["team"] != "ops" {
			return fmt.Errorf("labels %v: want tier=gold and team=ops, no region", n.Labels)
		}
		return nil
	})
}

// The Lease in kube-node-lease is the node's, and is renewed.
func (e *vnEnv) testLease(t *testing.T) {
	id := e.addPeer(t, "leased", nil, grant.Limits{})
	n := e.waitNode(t, id, "Ready", readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, ""))
	var first *coordinationv1.Lease
	eventually.Within(t, 30*time.Second, "lease created", func() (err error) {
		first, err = e.lease(t, id)
		return err
	})
	if h := first.Spec.HolderIdentity; h == nil || *h != n.Name {
		t.Errorf("lease holder %v, want %s", h, n.Name)
	}
	if d := first.Spec.LeaseDurationSeconds; d == nil || *d != 40 {
		t.Errorf("lease duration %v, want 40", d)
	}
	if len(first.OwnerReferences) != 1 || first.OwnerReferences[0].UID != n.UID {
		t.Errorf("lease owners %v, want the node %s", first.OwnerReferences, n.UID)
	}
	eventually.Within(t, 30*time.Second, "lease renewed", func() error {
		l, err := e.lease(t, id)
		if err != nil {
			return err
		}
		if l.ResourceVersion == first.ResourceVersion || !first.Spec.RenewTime.Before(l.Spec.RenewTime) {
			return fmt.Errorf("renewed at %v (version %s), first at %v (%s)", l.Spec.RenewTime, l.ResourceVersion, first.Spec.RenewTime, first.ResourceVersion)
		}
		return nil
	})
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

// Ready is False, with the reason, while the peering is not Connected or
// the credential does not work. The node lifecycle controller taints the
// node not-ready meanwhile; our writes keep its taint, and it keeps
// ours, even when ours is taken off and put back.
func (e *vnEnv) testReady(t *testing.T) {
	id := e.addPeer(t, "flaky", nil, grant.Limits{})
	e.waitNode(t, id, "Ready", readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, ""))
	// A node not Ready keeps its pods (they run on the provider).
	pod := e.createBoundPod(t, offload.VirtualNodeName(id), "on-flaky")
	defer func() {
		p, err := e.cp.Client.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID || p.DeletionTimestamp != nil {
			t.Errorf("the pod bound to a node that was not Ready for a while was deleted: %v", err)
		}
	}()

	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) { st.Phase = v1alpha1.PhaseDegraded })
	e.waitNode(t, id, "not Ready while Degraded", readyIs(corev1.ConditionFalse, ReasonPeerNotConnected, "Degraded"))
	eventually.Within(t, 30*time.Second, "flotilla_virtual_node_ready 0 while not Ready", func() error {
		if v, ok := e.metric(t, "flotilla_virtual_node_ready", map[string]string{"peer": id}); !ok || v != 0 {
			return fmt.Errorf("flotilla_virtual_node_ready{peer=%s} = %v (%v)", id, v, ok)
		}
		return nil
	})
	e.waitNode(t, id, "tainted not-ready by the node lifecycle controller", func(n *corev1.Node) error {
		if !hasTaint(n, corev1.TaintNodeNotReady) {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		return nil
	})
	// Take our taint off, keeping the controller's: it comes back, and
	// the controller's stays. The agent and the controller write the node
	// too, so the update is retried on a conflict from a fresh read.
	nodes := e.cp.Client.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(t.Context(), offload.VirtualNodeName(id), metav1.GetOptions{})
		if err != nil {
			return err
		}
		var others []corev1.Taint
		for _, tt := range n.Spec.Taints {
			if tt.Key != offload.TaintVirtualNode {
				others = append(others, tt)
			}
		}
		n.Spec.Taints = others
		_, err = nodes.Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("take our taint off: %v", err)
	}
	e.setLabels(t, id, map[string]string{"state": "degraded"}) // a label write while tainted
	e.waitNode(t, id, "our taint back, the controller's kept", func(n *corev1.Node) error {
		if !hasTaint(n, offload.TaintVirtualNode) || !hasTaint(n, corev1.TaintNodeNotReady) || n.Labels["state"] != "degraded" {
			return fmt.Errorf("taints %v, labels %v", n.Spec.Taints, n.Labels)
		}
		return nil
	})

	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) { st.Phase = v1alpha1.PhaseConnected })
	e.waitNode(t, id, "Ready again, untainted by the controller", func(n *corev1.Node) error {
		if err := readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, "")(n); err != nil {
			return err
		}
		if hasTaint(n, corev1.TaintNodeNotReady) || !hasTaint(n, offload.TaintVirtualNode) {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		return nil
	})

	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) {
		setCredentialCondition(st, false, "Unverified", "the provider's API server at https://192.0.2.1:6443 refused it")
	})
	e.waitNode(t, id, "not Ready while the credential fails", readyIs(corev1.ConditionFalse, ReasonCredentialNotReady, "Unverified"))
	before, err := e.lease(t, id)
	if err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "lease renewed while not Ready", func() error {
		l, err := e.lease(t, id)
		if err != nil {
			return err
		}
		if l.ResourceVersion == before.ResourceVersion {
			return errors.New("not renewed")
		}
		return nil
	})
	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) { setCredentialCondition(st, true, "Ready", "works again") })
	e.waitNode(t, id, "Ready again", readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, ""))

	// Expired is what a provider unreachable for longer than the token's
	// lifetime leaves: the node stays, not Ready, so the pods bound to it
	// are not deleted, and comes back with the next grant.
	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) { setCredentialCondition(st, false, "Expired", "the credential expired") })
	e.waitNode(t, id, "not Ready while the credential is expired", readyIs(corev1.ConditionFalse, ReasonCredentialNotReady, "Expired"))
	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) { setCredentialCondition(st, true, "Ready", "renewed") })
	e.waitNode(t, id, "Ready after a new grant", readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, ""))
}

// createBoundPod creates pod name in the default namespace, bound to
// node; the namespace's default account may not be there yet, which
// admission waits for.
func (e *vnEnv) createBoundPod(t *testing.T, node, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			NodeName:    node,
			Tolerations: []corev1.Toleration{{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			Containers:  []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		},
	}
	var made *corev1.Pod
	eventually.Within(t, 30*time.Second, "create pod "+name, func() error {
		var err error
		made, err = e.cp.Client.CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "serviceaccount") {
			t.Fatalf("create pod %s: %v", name, err)
		}
		return err
	})
	return made
}

// Revoked, or the Peer gone: the node and its Lease are deleted, its
// series with them, and the pods bound to it.
func (e *vnEnv) testRemoved(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, id string)
	}{
		{"revoked", func(t *testing.T, id string) {
			e.creds.Drop(id)
			e.setStatus(t, id, func(st *v1alpha1.PeerStatus) {
				setCredentialCondition(st, false, "Revoked", "the peer revoked the grant")
			})
		}},
		{"peer deleted", func(t *testing.T, id string) {
			if err := e.admin.Delete(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id}}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := e.addPeer(t, "short-"+strings.ReplaceAll(tc.name, " ", "-"), nil, grant.Limits{})
			e.waitNode(t, id, "Ready", readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, ""))
			eventually.Within(t, 30*time.Second, "lease created", func() error { _, err := e.lease(t, id); return err })
			pod := e.createBoundPod(t, offload.VirtualNodeName(id), "on-"+strings.ReplaceAll(tc.name, " ", "-"))
			deletedBefore, _ := e.metric(t, "flotilla_virtual_node_writes_total", map[string]string{"write": "delete-pod"})
			tc.end(t, id)
			// Deleted by the agent (counted), not left for the pod garbage
			// collector: its controller would make it again at once.
			eventually.Within(t, 30*time.Second, "the pod bound to the node deleted by the agent", func() error {
				p, err := e.cp.Client.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
				if err == nil {
					return fmt.Errorf("pod %s still there (deleting: %v)", p.Name, p.DeletionTimestamp != nil)
				}
				if !apierrors.IsNotFound(err) {
					return err
				}
				if n, _ := e.metric(t, "flotilla_virtual_node_writes_total", map[string]string{"write": "delete-pod"}); n != deletedBefore+1 {
					return fmt.Errorf("pods deleted by the agent %v, want %v", n, deletedBefore+1)
				}
				return nil
			})
			eventually.Within(t, 30*time.Second, "node and lease deleted", func() error {
				if _, err := e.cp.Client.CoreV1().Nodes().Get(t.Context(), offload.VirtualNodeName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("node: %v", err)
				}
				if _, err := e.lease(t, id); !apierrors.IsNotFound(err) {
					return fmt.Errorf("lease: %v", err)
				}
				if _, ok := e.metric(t, "flotilla_virtual_node_ready", map[string]string{"peer": id}); ok {
					return errors.New("flotilla_virtual_node_ready still has the peer's series")
				}
				return nil
			})
		})
	}
}

// A Node named like our virtual node that we did not make is never
// written or deleted, nor is a Lease made for it; the controller says so
// (a counted error) and goes on.
func (e *vnEnv) testForeign(t *testing.T) {
	id := offloadtest.NewConsumer(t)
	name := offload.VirtualNodeName(id)
	// Our label without managed-by is not ours either.
	foreign := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{offload.LabelVirtualNode: "true", "owner": "someone"}}}
	foreign, err := e.cp.Client.CoreV1().Nodes().Create(t.Context(), foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.setGrant(id, grant.Limits{})
	if err := e.admin.Create(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id}}); err != nil {
		t.Fatal(err)
	}
	e.setStatus(t, id, func(st *v1alpha1.PeerStatus) {
		st.Phase = v1alpha1.PhaseConnected
		setCredentialCondition(st, true, "Ready", "a working credential")
	})
	eventually.Within(t, 30*time.Second, "the foreign node reported", func() error {
		if v, _ := e.metric(t, "flotilla_virtual_node_errors_total", map[string]string{"peer": id, "reason": "foreign"}); v < 1 {
			return errors.New("no foreign error counted")
		}
		return nil
	})
	unchanged := func(when string) {
		t.Helper()
		got, err := e.cp.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("foreign node %s: %v", when, err)
		}
		// kube-controller-manager writes it too (conditions, taints):
		// what is checked is that nothing of ours is on it.
		ours := got.UID != foreign.UID || !maps.Equal(got.Labels, foreign.Labels) || got.Annotations[annotationPeerLabels] != "" ||
			hasTaint(got, offload.TaintVirtualNode) || got.Status.DaemonEndpoints.KubeletEndpoint.Port != 0 ||
			slices.ContainsFunc(got.Status.Conditions, func(c corev1.NodeCondition) bool {
				return c.Reason == ReasonVirtualNodeReady || c.Reason == ReasonPeerNotConnected || c.Reason == ReasonCredentialNotReady || c.Reason == "VirtualNode"
			})
		if ours {
			t.Errorf("foreign node written %s: uid %s (was %s), labels %v, annotations %v, taints %v, status %+v",
				when, got.UID, foreign.UID, got.Labels, got.Annotations, got.Spec.Taints, got.Status)
		}
		if _, err := e.lease(t, id); !apierrors.IsNotFound(err) {
			t.Errorf("a Lease for the foreign node %s: %v", when, err)
		}
	}
	unchanged("while granted")

	if err := e.admin.Delete(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id}}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "the Peer's removal reconciled", func() error {
		if _, ok := e.metric(t, "flotilla_virtual_node_ready", map[string]string{"peer": id}); ok {
			return errors.New("flotilla_virtual_node_ready still has the peer's series")
		}
		return nil
	})
	unchanged("after the Peer is gone")
}

// createWitnessNode makes a Node that says it is Ready once and never
// again, with no Lease: the node lifecycle controller marks it
// unreachable after its grace period.
func (e *vnEnv) createWitnessNode(t *testing.T) string {
	t.Helper()
	now := metav1.Now()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "witness"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now},
		}},
	}
	n, err := e.cp.Client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Name
}

// watchLapses watches node from its state n on and records every state
// in which it is not Ready by our word, or carries a taint of the node
// lifecycle controller's: we put Ready back at once should the controller
// mark it Unknown, so a look at the end would miss it.
func (e *vnEnv) watchLapses(t *testing.T, n *corev1.Node) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lw := &toolscache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		opts.FieldSelector = "metadata.name=" + n.Name
		return e.cp.Client.CoreV1().Nodes().Watch(ctx, opts)
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, n.ResourceVersion, lw)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lapses []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			got, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			c := nodeCondition(got, corev1.NodeReady)
			if c == nil || c.Status != corev1.ConditionTrue || hasTaint(got, corev1.TaintNodeUnreachable) || hasTaint(got, corev1.TaintNodeNotReady) {
				mu.Lock()
				lapses = append(lapses, fmt.Sprintf("%s: Ready %+v, taints %v", ev.Type, c, got.Spec.Taints))
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lapses)
	}
}

// Once the node lifecycle controller has marked the witness unreachable
// (it is younger than our node, so its grace period ran out no earlier),
// our node has never been anything but Ready by our word, nor carried a
// taint of the controller's.
func (e *vnEnv) testLifecycle(t *testing.T, steady, witness string, lapses func() []string) {
	eventually.Within(t, 3*time.Minute, "the witness node marked unreachable by the node lifecycle controller", func() error {
		n, err := e.cp.Client.CoreV1().Nodes().Get(t.Context(), witness, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !hasTaint(n, corev1.TaintNodeUnreachable) {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		return nil
	})
	n, err := e.cp.Client.CoreV1().Nodes().Get(t.Context(), offload.VirtualNodeName(steady), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := readyIs(corev1.ConditionTrue, ReasonVirtualNodeReady, "")(n); err != nil {
		t.Error(err)
	}
	for _, l := range lapses() {
		t.Errorf("our Ready virtual node lapsed: %s", l)
	}
}

// The kubelet version is the API server's release, in a form semver
// parsers take, whatever the distribution appends.
func TestVirtualNodeKubeletVersion(t *testing.T) {
	for _, tc := range []struct{ server, want string }{
		{"v1.34.4", "v1.34.4-flotilla"},
		{"v1.31.2+k3s1", "v1.31.2-flotilla"},
		{"v1.30.5-gke.1014001", "v1.30.5-flotilla"},
	} {
		if got := virtualNodeKubeletVersion(tc.server); got != tc.want {
			t.Errorf("server %s: kubelet version %s, want %s", tc.server, got, tc.want)
		}
	}
	if got := virtualNodeKubeletVersion(""); !strings.HasPrefix(got, "v1.") || !strings.HasSuffix(got, "-flotilla") {
		t.Errorf("unknown server version: kubelet version %s, want v1.<release>-flotilla", got)
	}
}

// A grant's limits are the capacity; a limit not granted, or one a newer
// provider wrote that does not parse here, is the default.
func TestVirtualNodeCapacity(t *testing.T) {
	for _, tc := range []struct {
		limits grant.Limits
		want   corev1.ResourceList
	}{
		{grant.Limits{}, resources("1000", "4Ti", "10000")},
		{grant.Limits{CPU: "2500m", Memory: "3Gi", Pods: 7, Namespaces: 2}, resources("2500m", "3Gi", "7")},
		{grant.Limits{CPU: "lots", Memory: "16Gi"}, resources("1000", "16Gi", "10000")},
	} {
		if got := capacityOf(tc.limits); len(got) != len(tc.want) || !sameCapacity(got, tc.want) {
			t.Errorf("limits %+v: capacity %s, want %s", tc.limits, resourcesString(got), resourcesString(tc.want))
		}
	}
}
