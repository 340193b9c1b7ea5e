package vnode

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// What a virtual node says of itself.
const (
	// annotationPeerLabels lists the Peer's labels copied onto its
	// virtual node, so that one the Peer drops is dropped there too,
	// while labels an admin adds to the Node stay.
	annotationPeerLabels = "flotilla.io/peer-labels"

	// The reasons of a virtual node's Ready condition: True, or False
	// because the peering is not Connected or the credential does not
	// work (checked in that order).
	ReasonVirtualNodeReady   = "PeerReady"
	ReasonPeerNotConnected   = "PeerNotConnected"
	ReasonCredentialNotReady = "CredentialNotReady"
)

// The capacity of a virtual node whose grant sets no limit of a kind: no
// limit granted, so large that the scheduler never stops there first.
var virtualNodeDefaults = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("1000"),
	corev1.ResourceMemory: resource.MustParse("4Ti"),
	corev1.ResourcePods:   resource.MustParse("10000"),
}

// virtualNodeConditions are the condition types a virtual node writes;
// the pressure ones are always False: the provider's nodes have their own.
var virtualNodeConditions = []corev1.NodeConditionType{
	corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady,
}

// virtualNodeTaint keeps every pod that does not tolerate it off a
// virtual node, and evicts one bound there that does not.
var virtualNodeTaint = corev1.Taint{Key: offload.TaintVirtualNode, Value: "true", Effect: corev1.TaintEffectNoExecute}

// virtualNodeKubeletVersion is the kubelet version a virtual node
// reports, named as Flotilla's: the release of the cluster's API server
// (serverVersion), so that version skew checks (kubeadm upgrade plan,
// ...) find a kubelet of the control plane's release, in a form they
// parse; when that is unknown, the Kubernetes API release the agent is
// built with.
func virtualNodeKubeletVersion(serverVersion string) string {
	if v, err := version.ParseGeneric(serverVersion); err == nil {
		return fmt.Sprintf("v%d.%d.%d-flotilla", v.Major(), v.Minor(), v.Patch())
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/api" && strings.HasPrefix(d.Version, "v0.") {
				return "v1." + strings.TrimPrefix(d.Version, "v0.") + "-flotilla"
			}
		}
	}
	return "v1.0.0-flotilla"
}

// virtualNodeWanted says whether provider's Peer calls for a virtual
// node, and why not. A grant received keeps it, working or not (its
// Ready condition says which); one revoked or refused does not, nor one
// this cluster's admin has not accepted (spec.offloadTo). An
// expired one does: a provider unreachable for longer than a token's
// lifetime must not have its pods deleted here (the pod garbage collector
// deletes the pods of a deleted Node), and its next grant makes the node
// Ready again.
func virtualNodeWanted(peer *v1alpha1.Peer) (bool, string) {
	if peer == nil {
		return false, "its Peer is gone"
	}
	c := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadCredential)
	switch {
	case c == nil:
		return false, "it has granted this cluster nothing"
	case c.Status != metav1.ConditionTrue && slices.Contains([]string{"Revoked", "Refused"}, c.Reason):
		return false, "its grant is " + strings.ToLower(c.Reason)
	case c.Status != metav1.ConditionTrue && slices.Contains([]string{remote.ReasonAwaitingOptIn, remote.ReasonDeclined}, c.Reason):
		return false, "this cluster's admin has not accepted offloading there (" + c.Reason + ")"
	}
	return true, ""
}

// virtualNode is what the Node of one provider should say.
type virtualNode struct {
	name       string
	labels     map[string]string
	peerLabels []string // the keys of labels copied from the Peer
	// owner is the Peer: deleting it, or the CRD with every Peer on
	// uninstall, has the garbage collector delete the node too.
	owner  metav1.OwnerReference
	status corev1.NodeStatus
	ready  bool
}

// desiredNode is the virtual node of peer at now; cur is the Node there
// is (nil: none), whose transition times and, when the credential cannot
// be read, capacity are kept.
func (v *Nodes) desiredNode(peer *v1alpha1.Peer, cur *corev1.Node, now time.Time) virtualNode {
	name := offload.VirtualNodeName(peer.Name)
	want := virtualNode{name: name, owner: metav1.OwnerReference{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "Peer", Name: peer.Name, UID: peer.UID}}
	want.labels, want.peerLabels = offload.VirtualNodeLabels(peer, name)

	_, g, credErr := v.cfg.Credentials.Credential(peer.Name)
	capacity := capacityOf(g.Limits)
	if credErr != nil && cur != nil && len(cur.Status.Capacity) > 0 {
		capacity = cur.Status.Capacity.DeepCopy() // the last limits known
	}
	ready := readyCondition(peer, credErr)
	want.ready = ready.Status == corev1.ConditionTrue

	beat := metav1.NewTime(now.Truncate(time.Second))
	conds := make([]corev1.NodeCondition, 0, len(virtualNodeConditions))
	for _, t := range virtualNodeConditions {
		c := corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Reason: "VirtualNode",
			Message: "a virtual node has no resources of its own: the grant's limits bound what runs on the provider"}
		if t == corev1.NodeReady {
			c = ready
		}
		c.LastHeartbeatTime, c.LastTransitionTime = beat, beat
		if cur != nil {
			if old := nodeCondition(cur, t); old != nil && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		conds = append(conds, c)
	}
	clusterName := peer.Status.ClusterName
	if clusterName == "" {
		clusterName = peer.Name
	}
	want.status = corev1.NodeStatus{
		Capacity: capacity, Allocatable: capacity.DeepCopy(),
		Conditions: conds,
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: v.cfg.Address.String()},
			{Type: corev1.NodeHostName, Address: name},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: v.cfg.KubeletPort}},
		NodeInfo: corev1.NodeSystemInfo{
			OperatingSystem: "linux", Architecture: runtime.GOARCH,
			KubeletVersion:          v.kubeletVersion,
			ContainerRuntimeVersion: "flotilla://offload",
			OSImage:                 "Flotilla virtual node of cluster " + clusterName,
		},
	}
	return want
}

// readyCondition is the truth about a provider: its pods can be reached
// only over a Connected peering, and made only with a working credential.
func readyCondition(peer *v1alpha1.Peer, credErr error) corev1.NodeCondition {
	name := peer.Status.ClusterName
	if name == "" {
		name = peer.Name
	}
	c := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadCredential)
	switch {
	case peer.Status.Phase != v1alpha1.PhaseConnected:
		phase := string(peer.Status.Phase)
		if phase == "" {
			phase = "not started"
		}
		return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: ReasonPeerNotConnected,
			Message: fmt.Sprintf("the peering with %s is %s, not Connected: its pods cannot be reached until it is (kubectl get peer %s)", name, phase, peer.Name)}
	case c == nil || c.Status != metav1.ConditionTrue:
		why := "no credential"
		if c != nil {
			why = c.Reason + ": " + c.Message
		}
		return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: ReasonCredentialNotReady,
			Message: fmt.Sprintf("the credential %s granted does not work (%s)", name, why)}
	case credErr != nil:
		return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: ReasonCredentialNotReady,
			Message: fmt.Sprintf("the credential %s granted is not held: %v", name, credErr)}
	}
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: ReasonVirtualNodeReady,
		Message: fmt.Sprintf("the peering with %s is Connected and its credential works", name)}
}

// capacityOf is a grant's limits as a node's capacity; a limit not set,
// or one that does not parse (a newer provider's), is the default.
func capacityOf(l grant.Limits) corev1.ResourceList {
	c := virtualNodeDefaults.DeepCopy()
	if q, err := resource.ParseQuantity(l.CPU); err == nil && l.CPU != "" {
		c[corev1.ResourceCPU] = q
	}
	if q, err := resource.ParseQuantity(l.Memory); err == nil && l.Memory != "" {
		c[corev1.ResourceMemory] = q
	}
	if l.Pods > 0 {
		c[corev1.ResourcePods] = *resource.NewQuantity(l.Pods, resource.DecimalSI)
	}
	return c
}

func nodeCondition(n *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// createNode creates the virtual node. One of its name that exists
// already (created in between, or not ours) is read: ours, it is
// returned; anyone else's, errForeignNode. Never an apply: that would
// adopt a Node someone else made.
func (v *Nodes) createNode(ctx context.Context, want virtualNode) (*corev1.Node, error) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: want.name, Labels: want.labels,
			Annotations:     map[string]string{annotationPeerLabels: strings.Join(want.peerLabels, ",")},
			OwnerReferences: []metav1.OwnerReference{want.owner}},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{virtualNodeTaint}},
		Status: want.status,
	}
	nodes := v.cfg.Client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, n, metav1.CreateOptions{FieldManager: FieldManager})
	if err == nil {
		v.m.writes.WithLabelValues("create").Inc()
		v.log.Info("virtual node created", "node", want.name, "ready", want.ready, "capacity", resourcesString(want.status.Capacity))
		return created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create virtual node %s: %w", want.name, err)
	}
	got, err := nodes.Get(ctx, want.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read virtual node %s: %w", want.name, err)
	}
	if !isOurVirtualNode(got) {
		return nil, fmt.Errorf("node %s: %w", want.name, errForeignNode)
	}
	return got, nil
}

// patchNode brings our Node cur in line with want: labels (and our taint,
// should someone have removed it), then status when it says something
// else or its heartbeat is due. Patches, never a whole Node: the node
// lifecycle controller writes taints and conditions too. Each patch
// carries cur's resourceVersion, so none lands on a Node that changed
// hands since it was read.
func (v *Nodes) patchNode(ctx context.Context, want virtualNode, cur *corev1.Node, now time.Time) (*corev1.Node, error) {
	nodes := v.cfg.Client.CoreV1().Nodes()
	if p := metadataPatch(want, cur); p != nil {
		data, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		if cur, err = nodes.Patch(ctx, want.name, types.StrategicMergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return nil, fmt.Errorf("label virtual node %s: %w", want.name, err)
		}
		v.m.writes.WithLabelValues("labels").Inc()
	}
	if statusSays(cur, want) && !heartbeatDue(cur, now) {
		return cur, nil
	}
	data, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": cur.ResourceVersion},
		"status":   want.status,
	})
	if err != nil {
		return nil, err
	}
	wasReady := nodeCondition(cur, corev1.NodeReady)
	cur, err = nodes.Patch(ctx, want.name, types.StrategicMergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if err != nil {
		return nil, fmt.Errorf("write the status of virtual node %s: %w", want.name, err)
	}
	v.m.writes.WithLabelValues("status").Inc()
	if is := nodeCondition(cur, corev1.NodeReady); is != nil && (wasReady == nil || wasReady.Status != is.Status || wasReady.Reason != is.Reason) {
		v.log.Info("virtual node readiness changed", "node", want.name, "ready", is.Status, "reason", is.Reason, "message", is.Message)
	}
	return cur, nil
}

// metadataPatch is the strategic merge patch that gives cur want's
// labels and our taint; nil when it has them.
func metadataPatch(want virtualNode, cur *corev1.Node) map[string]any {
	labels := map[string]any{}
	for k, val := range want.labels {
		if have, ok := cur.Labels[k]; !ok || have != val {
			labels[k] = val
		}
	}
	for _, k := range strings.Split(cur.Annotations[annotationPeerLabels], ",") {
		if _, keep := want.labels[k]; k != "" && !keep && !offload.ReservedLabelKey(k) {
			labels[k] = nil // the Peer dropped it
		}
	}
	copied := strings.Join(want.peerLabels, ",")
	hasTaint := slices.ContainsFunc(cur.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&virtualNodeTaint) })
	if len(labels) == 0 && cur.Annotations[annotationPeerLabels] == copied && hasTaint {
		return nil
	}
	p := map[string]any{"metadata": map[string]any{
		"resourceVersion": cur.ResourceVersion,
		"labels":          labels,
		"annotations":     map[string]any{annotationPeerLabels: copied},
	}}
	if !hasTaint {
		// Taints are one list to a strategic merge patch: the patch
		// carries the others as read, and the resourceVersion makes sure
		// none was added since.
		p["spec"] = map[string]any{"taints": append(slices.Clone(cur.Spec.Taints), virtualNodeTaint)}
	}
	return p
}

// statusSays reports whether n's status says what want's does, times
// aside.
func statusSays(n *corev1.Node, want virtualNode) bool {
	st := &n.Status
	if !sameCapacity(st.Capacity, want.status.Capacity) || !sameCapacity(st.Allocatable, want.status.Allocatable) ||
		st.DaemonEndpoints != want.status.DaemonEndpoints || st.NodeInfo != want.status.NodeInfo {
		return false
	}
	for _, a := range want.status.Addresses {
		if !slices.Contains(st.Addresses, a) {
			return false
		}
	}
	for _, c := range want.status.Conditions {
		have := nodeCondition(n, c.Type)
		if have == nil || have.Status != c.Status || have.Reason != c.Reason || have.Message != c.Message {
			return false
		}
	}
	return true
}

// heartbeatDue reports whether n's Ready condition was last written more
// than virtualNodeHeartbeat ago.
func heartbeatDue(n *corev1.Node, now time.Time) bool {
	c := nodeCondition(n, corev1.NodeReady)
	return c == nil || !now.Before(c.LastHeartbeatTime.Add(virtualNodeHeartbeat))
}

func sameCapacity(a, b corev1.ResourceList) bool {
	for k, q := range b {
		if have, ok := a[k]; !ok || have.Cmp(q) != 0 {
			return false
		}
	}
	return true
}

func resourcesString(l corev1.ResourceList) string {
	return fmt.Sprintf("cpu=%s memory=%s pods=%s", l.Cpu(), l.Memory(), l.Pods())
}
