package placement

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// Placement (docs/offload.md, "Placement"): what the admission webhook
// does to a pod of an offloaded namespace, as pure logic. The webhook
// (webhook.go) feeds it the pod, the namespace's NamespaceOffload, the
// Nodes and the Peers, and turns its answer into an AdmissionResponse.

// placementInput is what placement decides on.
type placementInput struct {
	pod *corev1.Pod
	// namespace is the pod's (the request's: a pod being created may
	// not carry it yet).
	namespace string
	// offload is the NamespaceOffload acting in the namespace; nil when
	// there is none (the pod is admitted unchanged).
	offload *v1alpha1.NamespaceOffload
	// nodes are the cluster's Nodes (names and labels are what counts).
	nodes []*corev1.Node
	// peerLabels are the labels of each Peer (by cluster ID): a virtual
	// node not registered yet will carry them.
	peerLabels map[string]map[string]string
}

// placementRefusal is a pod placement refuses: its message says why, to the
// user who created the pod.
type placementRefusal struct{ message string }

func (r *placementRefusal) Error() string { return r.message }

// Tolerations placement adds. Remote pods tolerate a NotReady or
// unreachable node for ever: a provider out of reach for a while keeps
// running them, and evicting the consumer's pod would delete the remote
// one (docs/offload.md).
var (
	virtualNodeToleration = corev1.Toleration{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}
	foreverTolerations    = []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	}
)

// place decides pod's placement: the JSON patch that applies the
// namespace's pod strategy (nil: admit it unchanged), or a *placementRefusal
// when the pod's own terms contradict the strategy. Applying the patch
// and placing the result again gives no patch.
func place(in placementInput) ([]offload.PatchOp, error) {
	o := in.offload
	if o == nil {
		return nil, nil
	}
	s := newStrategy(o)
	if s.mode == v1alpha1.PodsRemote && len(s.clusters) == 0 {
		return nil, &placementRefusal{fmt.Sprintf(
			"namespace %s is offloaded with podOffloading Remote, but NamespaceOffload %s has no provider yet (phase %q): "+
				"a pod here can run only on a provider. Wait until `kubectl -n %s get namespaceoffload %s` lists clusters, "+
				"check its clusterSelector and the Peers that granted this cluster offloading, or use podOffloading LocalAndRemote",
			in.namespace, o.Name, o.Status.Phase, in.namespace, o.Name)}
	}
	want := in.pod.DeepCopy()
	setRequiredTerms(want, crossTerms(requiredTerms(in.pod), s.terms()))
	if s.mutates() {
		want.Spec.Tolerations = placedTolerations(in.pod.Spec.Tolerations, s.mode)
	}
	if err := checkContradiction(in, s, want); err != nil {
		return nil, err
	}
	if !s.mutates() {
		return nil, nil // Local: the taint keeps its pods off virtual nodes
	}
	var ops []offload.PatchOp
	if !equality.Semantic.DeepEqual(in.pod.Spec.Affinity, want.Spec.Affinity) {
		ops = append(ops, offload.PatchOp{Op: "add", Path: "/spec/affinity", Value: want.Spec.Affinity})
	}
	if !equality.Semantic.DeepEqual(in.pod.Spec.Tolerations, want.Spec.Tolerations) {
		ops = append(ops, offload.PatchOp{Op: "add", Path: "/spec/tolerations", Value: want.Spec.Tolerations})
	}
	return ops, nil
}

// strategy is a NamespaceOffload's pod strategy and the clusters it
// selected.
type strategy struct {
	mode     v1alpha1.PodOffloading
	clusters []v1alpha1.ClusterOffload // by cluster ID, each once
}

func newStrategy(o *v1alpha1.NamespaceOffload) strategy {
	s := strategy{mode: o.Spec.PodOffloading}
	if s.mode == "" {
		s.mode = v1alpha1.PodsLocalAndRemote // the CRD's default
	}
	for _, c := range o.Status.Clusters {
		if c.ClusterID != "" && !slices.ContainsFunc(s.clusters, func(d v1alpha1.ClusterOffload) bool { return d.ClusterID == c.ClusterID }) {
			s.clusters = append(s.clusters, c)
		}
	}
	slices.SortFunc(s.clusters, func(a, b v1alpha1.ClusterOffload) int { return strings.Compare(a.ClusterID, b.ClusterID) })
	return s
}

func (s strategy) ids() []string {
	ids := make([]string, len(s.clusters))
	for i, c := range s.clusters {
		ids[i] = c.ClusterID
	}
	return ids
}

// mutates says whether pods get our toleration and terms. Local ones do
// not: the taint keeps them off virtual nodes. Nor do LocalAndRemote
// ones while no cluster is selected: they can only run here.
func (s strategy) mutates() bool { return s.mode != v1alpha1.PodsLocal && len(s.clusters) > 0 }

// terms are the node selector terms (ORed) where the strategy lets a pod
// run; for Local and for LocalAndRemote without clusters they are only
// checked, never added.
func (s strategy) terms() []corev1.NodeSelectorTerm {
	local := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: offload.LabelVirtualNode, Operator: corev1.NodeSelectorOpDoesNotExist}}}
	if len(s.clusters) == 0 || s.mode == v1alpha1.PodsLocal {
		return []corev1.NodeSelectorTerm{local}
	}
	remote := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: offload.LabelClusterID, Operator: corev1.NodeSelectorOpIn, Values: s.ids()}}}
	if s.mode == v1alpha1.PodsRemote {
		return []corev1.NodeSelectorTerm{remote}
	}
	return []corev1.NodeSelectorTerm{remote, local}
}

// describe says where the strategy lets pods run, for refusals.
func (s strategy) describe() string {
	var names []string
	for _, c := range s.clusters {
		n := c.ClusterID
		if c.ClusterName != "" {
			n = c.ClusterName + " (" + c.ClusterID + ")"
		}
		names = append(names, n)
	}
	switch {
	case s.mode == v1alpha1.PodsLocal:
		return "podOffloading Local: only on this cluster's own nodes"
	case len(names) == 0:
		return "podOffloading " + string(s.mode) + " with no provider selected yet: only on this cluster's own nodes"
	case s.mode == v1alpha1.PodsRemote:
		return "podOffloading Remote: only on the virtual nodes of the selected clusters " + strings.Join(names, ", ")
	}
	return "podOffloading LocalAndRemote: on this cluster's own nodes or the virtual nodes of the selected clusters " + strings.Join(names, ", ")
}

// requiredTerms are pod's required node affinity terms (nil: none).
func requiredTerms(pod *corev1.Pod) []corev1.NodeSelectorTerm {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
}

// conforms reports whether term t already holds one of our
// requirements: it implies the strategy by itself (a pod admitted again,
// or one that chose its placement within the strategy).
func conforms(t corev1.NodeSelectorTerm, ours []corev1.NodeSelectorTerm) bool {
	for _, o := range ours {
		for _, r := range o.MatchExpressions {
			if slices.ContainsFunc(t.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool { return equality.Semantic.DeepEqual(e, r) }) {
				return true
			}
		}
	}
	return false
}

func isEmptyTerm(t corev1.NodeSelectorTerm) bool {
	return len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0
}

// crossTerms ANDs two ORs of terms: every term of own with every term
// of ours. A term that already conforms implies ours and stays as it
// is, so crossing twice changes nothing; so does an empty one, which
// matches no node and must still match none.
func crossTerms(own, ours []corev1.NodeSelectorTerm) []corev1.NodeSelectorTerm {
	if own == nil {
		return slices.Clone(ours)
	}
	var out []corev1.NodeSelectorTerm
	for _, t := range own {
		if isEmptyTerm(t) || conforms(t, ours) {
			out = append(out, t)
			continue
		}
		for _, o := range ours {
			out = append(out, corev1.NodeSelectorTerm{
				MatchExpressions: append(slices.Clone(t.MatchExpressions), o.MatchExpressions...),
				MatchFields:      slices.Clone(t.MatchFields),
			})
		}
	}
	return out
}

// setRequiredTerms replaces pod's required node affinity terms, keeping
// the rest of its affinity.
func setRequiredTerms(pod *corev1.Pod, terms []corev1.NodeSelectorTerm) {
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: terms}
}

// placedTolerations are pod's tolerations with ours: the virtual nodes'
// taint and, for Remote, the NotReady and unreachable taints for ever
// instead of for a time (DefaultTolerationSeconds' 300 s, or the pod's
// own).
func placedTolerations(tols []corev1.Toleration, mode v1alpha1.PodOffloading) []corev1.Toleration {
	out := slices.Clone(tols)
	add := []corev1.Toleration{virtualNodeToleration}
	if mode == v1alpha1.PodsRemote {
		out = slices.DeleteFunc(out, func(t corev1.Toleration) bool {
			timed := t.TolerationSeconds != nil && (t.Effect == corev1.TaintEffectNoExecute || t.Effect == "")
			return timed && (t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable)
		})
		add = append(add, foreverTolerations...)
	}
	for _, a := range add {
		if !slices.ContainsFunc(out, func(t corev1.Toleration) bool { return equality.Semantic.DeepEqual(t, a) }) {
			out = append(out, a)
		}
	}
	return out
}

// checkContradiction refuses a pod whose own terms (nodeName,
// nodeSelector, required node affinity) let it run on some node but
// none once combined with the strategy: it would stay Pending for ever.
// A pod whose own terms match no node at all is left to wait as it
// would without us (a node may come). Nodes are the registered ones and
// the virtual nodes of selected clusters not registered yet.
func checkContradiction(in placementInput, s strategy, placed *corev1.Pod) error {
	nodes := candidateNodes(in, s)
	mine, both := matching(in.pod, nodes), matching(placed, nodes)
	if len(mine) == 0 || len(both) > 0 {
		return nil
	}
	name := in.pod.Name
	if name == "" {
		name = in.pod.GenerateName + "<generated>"
	}
	return &placementRefusal{fmt.Sprintf(
		"pod %s/%s can run nowhere: its %s match %s, but namespace %s's NamespaceOffload %s allows %s, and no node is both. "+
			"Change the pod's node terms, or the NamespaceOffload's podOffloading or clusterSelector",
		in.namespace, name, describeOwnTerms(in.pod), describeNodes(mine), in.namespace, in.offload.Name, s.describe())}
}

// candidateNodes are the registered nodes and, for each selected
// cluster whose virtual node is not registered yet, the node it will be
// (its provider's mirrored namespace may still be on its way).
func candidateNodes(in placementInput, s strategy) []*corev1.Node {
	nodes := slices.Clone(in.nodes)
	for _, c := range s.clusters {
		name := offload.VirtualNodeName(c.ClusterID)
		if slices.ContainsFunc(in.nodes, func(n *corev1.Node) bool { return n.Name == name }) {
			continue
		}
		nodes = append(nodes, expectedVirtualNode(c, in.peerLabels[c.ClusterID]))
	}
	return nodes
}

// expectedVirtualNode is the virtual node of cluster c as it will be
// registered, labelled as vnode.Nodes labels it
// (offload.VirtualNodeLabels).
func expectedVirtualNode(c v1alpha1.ClusterOffload, peerLabels map[string]string) *corev1.Node {
	name := offload.VirtualNodeName(c.ClusterID)
	peer := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: c.ClusterID, Labels: peerLabels}, Status: v1alpha1.PeerStatus{ClusterName: c.ClusterName}}
	labels, _ := offload.VirtualNodeLabels(peer, name)
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// matching are the nodes pod's nodeName and required terms let it run
// on, by name.
func matching(pod *corev1.Pod, nodes []*corev1.Node) []string {
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	var out []string
	for _, n := range nodes {
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Name {
			continue
		}
		// A term that does not parse matches nothing; validation, after
		// admission, refuses the pod with its own message.
		if ok, err := req.Match(n); ok && err == nil {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out
}

// describeOwnTerms names the pod's node terms, for refusals.
func describeOwnTerms(pod *corev1.Pod) string {
	var parts []string
	if pod.Spec.NodeName != "" {
		parts = append(parts, "nodeName "+pod.Spec.NodeName)
	}
	if len(pod.Spec.NodeSelector) > 0 {
		var kv []string
		for k, v := range pod.Spec.NodeSelector {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		parts = append(parts, "nodeSelector "+strings.Join(kv, ","))
	}
	if terms := requiredTerms(pod); terms != nil {
		var ts []string
		for _, t := range terms {
			ts = append(ts, "("+describeTerm(t)+")")
		}
		parts = append(parts, "required node affinity "+strings.Join(ts, " OR "))
	}
	if len(parts) == 0 {
		return "node terms (none)"
	}
	return "node terms [" + strings.Join(parts, "; ") + "]"
}

func describeTerm(t corev1.NodeSelectorTerm) string {
	var rs []string
	for _, r := range t.MatchExpressions {
		rs = append(rs, describeRequirement(r))
	}
	for _, r := range t.MatchFields {
		rs = append(rs, describeRequirement(r))
	}
	if len(rs) == 0 {
		return "empty: matches no node"
	}
	return strings.Join(rs, " AND ")
}

func describeRequirement(r corev1.NodeSelectorRequirement) string {
	if len(r.Values) == 0 {
		return r.Key + " " + string(r.Operator)
	}
	return r.Key + " " + string(r.Operator) + " [" + strings.Join(r.Values, ",") + "]"
}

// describeNodes names a few nodes.
func describeNodes(names []string) string {
	const shown = 5
	if len(names) > shown {
		return "nodes " + strings.Join(names[:shown], ", ") + fmt.Sprintf(" and %d more", len(names)-shown)
	}
	if len(names) == 1 {
		return "node " + names[0]
	}
	return "nodes " + strings.Join(names, ", ")
}
