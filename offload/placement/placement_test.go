package placement

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// Cluster IDs of the providers in the placement tests.
const (
	idA = "caaaaaaaaaaaaaaaaaaaaaaaaaa"
	idB = "cbbbbbbbbbbbbbbbbbbbbbbbbbb"
	idC = "ccccccccccccccccccccccccccc"
)

// placementNodes: two local nodes, one of them with an SSD, and the
// virtual nodes of providers a (region eu) and b (region us). Provider
// c has no virtual node yet.
func placementNodes() []*corev1.Node {
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	virtual := func(id, name, region string) *corev1.Node {
		return node(offload.VirtualNodeName(id), map[string]string{offload.LabelVirtualNode: "true", offload.LabelClusterID: id, offload.LabelClusterName: name, "region": region})
	}
	return []*corev1.Node{
		node("local1", map[string]string{"kubernetes.io/hostname": "local1", "disk": "ssd"}),
		node("local2", map[string]string{"kubernetes.io/hostname": "local2"}),
		virtual(idA, "a", "eu"),
		virtual(idB, "b", "us"),
	}
}

var placementPeers = map[string]map[string]string{
	idA: {"region": "eu"},
	idB: {"region": "us"},
	// A Peer's labels under Kubernetes' prefixes are not the virtual
	// node's.
	idC: {"region": "ap", "topology.kubernetes.io/zone": "ap-1"},
}

func offloadOf(mode v1alpha1.PodOffloading, ids ...string) *v1alpha1.NamespaceOffload {
	names := map[string]string{idA: "a", idB: "b", idC: "c"}
	o := &v1alpha1.NamespaceOffload{
		ObjectMeta: metav1.ObjectMeta{Name: "offload", Namespace: "shop"},
		Spec:       v1alpha1.NamespaceOffloadSpec{PodOffloading: mode},
		Status:     v1alpha1.NamespaceOffloadStatus{Phase: v1alpha1.OffloadReady},
	}
	if len(ids) == 0 {
		o.Status.Phase = v1alpha1.OffloadNoClusterSelected
	}
	for _, id := range ids {
		o.Status.Clusters = append(o.Status.Clusters, v1alpha1.ClusterOffload{ClusterID: id, ClusterName: names[id]})
	}
	return o
}

// testPod is a pod as it reaches the webhook: DefaultTolerationSeconds
// has added its two tolerations of 300 s.
func testPod(changes ...func(*corev1.Pod)) *corev1.Pod {
	seconds := int64(300)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}},
			Tolerations: []corev1.Toleration{
				{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds},
			},
		},
	}
	for _, c := range changes {
		c(p)
	}
	return p
}

func nodeSelector(kv ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Spec.NodeSelector[kv[i]] = kv[i+1]
		}
	}
}

func nodeName(n string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

// requires sets the pod's required node affinity terms.
func requires(terms ...corev1.NodeSelectorTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) { setRequiredTerms(p, terms) }
}

func term(reqs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: reqs}
}

func in(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
}

var (
	remoteTo = func(ids ...string) corev1.NodeSelectorRequirement { return in(offload.LabelClusterID, ids...) }
	localReq = corev1.NodeSelectorRequirement{Key: offload.LabelVirtualNode, Operator: corev1.NodeSelectorOpDoesNotExist}
)

// applyPatch applies what place returns: "add" of a spec field.
func applyPatch(t *testing.T, pod *corev1.Pod, ops []offload.PatchOp) *corev1.Pod {
	t.Helper()
	out := pod.DeepCopy()
	for _, op := range ops {
		raw, err := json.Marshal(op.Value)
		if err != nil {
			t.Fatal(err)
		}
		var dst any
		switch {
		case op.Op == "add" && op.Path == "/spec/affinity":
			out.Spec.Affinity = nil
			dst = &out.Spec.Affinity
		case op.Op == "add" && op.Path == "/spec/tolerations":
			out.Spec.Tolerations = nil
			dst = &out.Spec.Tolerations
		default:
			t.Fatalf("unexpected patch operation %+v", op)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestPlace(t *testing.T) {
	forever := func(key string) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}
	}
	remoteTolerations := []corev1.Toleration{virtualNodeToleration, forever(corev1.TaintNodeNotReady), forever(corev1.TaintNodeUnreachable)}
	withVirtual := func(tols []corev1.Toleration) []corev1.Toleration { return append(tols, virtualNodeToleration) }
	defaults := testPod().Spec.Tolerations

	for _, tc := range []struct {
		name    string
		offload *v1alpha1.NamespaceOffload
		pod     *corev1.Pod
		// terms and tolerations the placed pod has; nil terms: no patch
		// (the pod is admitted as it is).
		terms       []corev1.NodeSelectorTerm
		tolerations []corev1.Toleration
		// refused: substrings of the refusal's message.
		refused []string
	}{
		{name: "not offloaded", pod: testPod()},
		{
			name: "Remote", offload: offloadOf(v1alpha1.PodsRemote, idA, idB), pod: testPod(),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA, idB))}, tolerations: remoteTolerations,
		},
		{
			// Its own 60 s is replaced as well: a provider out of reach
			// never pulls a Remote pod back.
			name: "Remote replaces the pod's own not-ready seconds", offload: offloadOf(v1alpha1.PodsRemote, idA),
			pod: testPod(func(p *corev1.Pod) {
				sixty := int64(60)
				p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, TolerationSeconds: &sixty}, {Key: "dedicated", Operator: corev1.TolerationOpExists}}
			}),
			terms:       []corev1.NodeSelectorTerm{term(remoteTo(idA))},
			tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}, virtualNodeToleration, forever(corev1.TaintNodeNotReady), forever(corev1.TaintNodeUnreachable)},
		},
		{
			name: "Remote with a selector a selected provider has", offload: offloadOf(v1alpha1.PodsRemote, idA, idB), pod: testPod(nodeSelector("region", "us")),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA, idB))}, tolerations: remoteTolerations,
		},
		{
			name: "Remote with a selector only a local node has", offload: offloadOf(v1alpha1.PodsRemote, idA, idB), pod: testPod(nodeSelector("disk", "ssd")),
			refused: []string{"pod shop/web", "nodeSelector disk=ssd", "match node local1", "podOffloading Remote", "a (" + idA + "), b (" + idB + ")", "NamespaceOffload offload"},
		},
		{
			name: "Remote with a selector only an unselected provider has", offload: offloadOf(v1alpha1.PodsRemote, idA), pod: testPod(nodeSelector("region", "us")),
			refused: []string{"nodeSelector region=us", "match node " + offload.VirtualNodeName(idB), "selected clusters a (" + idA + ")"},
		},
		{
			name: "Remote with nodeName a local node", offload: offloadOf(v1alpha1.PodsRemote, idA), pod: testPod(nodeName("local2")),
			refused: []string{"nodeName local2", "match node local2", "podOffloading Remote"},
		},
		{
			name: "Remote with nodeName a selected virtual node", offload: offloadOf(v1alpha1.PodsRemote, idA), pod: testPod(nodeName(offload.VirtualNodeName(idA))),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA))}, tolerations: remoteTolerations,
		},
		{
			// Terms are ORed: ours is ANDed into each; one of them still
			// matches a provider, so the pod is admitted.
			name: "Remote with two terms of its own", offload: offloadOf(v1alpha1.PodsRemote, idA),
			pod:   testPod(requires(term(in("region", "eu")), term(in("disk", "ssd")))),
			terms: []corev1.NodeSelectorTerm{term(in("region", "eu"), remoteTo(idA)), term(in("disk", "ssd"), remoteTo(idA))}, tolerations: remoteTolerations,
		},
		{
			name: "Remote with terms that match local nodes only", offload: offloadOf(v1alpha1.PodsRemote, idA),
			pod:     testPod(requires(term(in("disk", "ssd")), corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{in("metadata.name", "local2")}})),
			refused: []string{"required node affinity (disk In [ssd]) OR (metadata.name In [local2])", "match nodes local1, local2"},
		},
		{
			// Nothing matches the pod's own terms: it waits, as it would
			// without us.
			name: "Remote with a selector no node has", offload: offloadOf(v1alpha1.PodsRemote, idA), pod: testPod(nodeSelector("gpu", "h100")),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA))}, tolerations: remoteTolerations,
		},
		{
			name: "Remote without a provider", offload: offloadOf(v1alpha1.PodsRemote), pod: testPod(),
			refused: []string{"namespace shop is offloaded with podOffloading Remote", "no provider yet", `phase "NoClusterSelected"`},
		},
		{
			// Its virtual node is not registered yet; it will carry the
			// Peer's labels.
			name: "Remote to a provider whose node is not there yet", offload: offloadOf(v1alpha1.PodsRemote, idC), pod: testPod(nodeSelector("region", "ap")),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idC))}, tolerations: remoteTolerations,
		},
		{
			name: "LocalAndRemote", offload: offloadOf(v1alpha1.PodsLocalAndRemote, idA), pod: testPod(),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA)), term(localReq)}, tolerations: withVirtual(defaults),
		},
		{
			name: "LocalAndRemote by default", offload: offloadOf("", idA), pod: testPod(),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA)), term(localReq)}, tolerations: withVirtual(defaults),
		},
		{
			name: "LocalAndRemote with a selector of a local node", offload: offloadOf(v1alpha1.PodsLocalAndRemote, idA), pod: testPod(nodeSelector("disk", "ssd")),
			terms: []corev1.NodeSelectorTerm{term(remoteTo(idA)), term(localReq)}, tolerations: withVirtual(defaults),
		},
		{
			name: "LocalAndRemote with a selector only an unselected provider has", offload: offloadOf(v1alpha1.PodsLocalAndRemote, idA), pod: testPod(nodeSelector("region", "us")),
			refused: []string{"nodeSelector region=us", "podOffloading LocalAndRemote: on this cluster's own nodes or the virtual nodes of the selected clusters a (" + idA + ")"},
		},
		{
			// Its own term already keeps it local: it stays as it is.
			name: "LocalAndRemote with a pod that chose local", offload: offloadOf(v1alpha1.PodsLocalAndRemote, idA), pod: testPod(requires(term(localReq))),
			terms: []corev1.NodeSelectorTerm{term(localReq)}, tolerations: withVirtual(defaults),
		},
		{
			// An empty term matches no node, and still none after.
			name: "LocalAndRemote keeps an empty term", offload: offloadOf(v1alpha1.PodsLocalAndRemote, idA), pod: testPod(requires(term(), term(in("region", "eu")))),
			terms: []corev1.NodeSelectorTerm{term(), term(in("region", "eu"), remoteTo(idA)), term(in("region", "eu"), localReq)}, tolerations: withVirtual(defaults),
		},
		{
			name: "LocalAndRemote without a provider", offload: offloadOf(v1alpha1.PodsLocalAndRemote), pod: testPod(),
		},
		{
			name: "LocalAndRemote without a provider, a pod for a virtual node", offload: offloadOf(v1alpha1.PodsLocalAndRemote), pod: testPod(nodeSelector(offload.LabelVirtualNode, "true")),
			refused: []string{"with no provider selected yet: only on this cluster's own nodes"},
		},
		{name: "Local", offload: offloadOf(v1alpha1.PodsLocal, idA), pod: testPod()},
		{
			name: "Local with a selector of virtual nodes", offload: offloadOf(v1alpha1.PodsLocal, idA), pod: testPod(nodeSelector(offload.LabelClusterID, idA)),
			refused: []string{"nodeSelector " + offload.LabelClusterID + "=" + idA, "podOffloading Local: only on this cluster's own nodes"},
		},
		{
			name: "Local with nodeName a virtual node", offload: offloadOf(v1alpha1.PodsLocal, idA), pod: testPod(nodeName(offload.VirtualNodeName(idA))),
			refused: []string{"nodeName " + offload.VirtualNodeName(idA), "podOffloading Local"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input := placementInput{pod: tc.pod, namespace: "shop", offload: tc.offload, nodes: placementNodes(), peerLabels: placementPeers}
			ops, err := place(input)
			if tc.refused != nil {
				var r *placementRefusal
				if !errors.As(err, &r) {
					t.Fatalf("place: %v, %v; want a refusal", ops, err)
				}
				for _, want := range tc.refused {
					if !strings.Contains(r.message, want) {
						t.Errorf("refusal %q\nlacks %q", r.message, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("place: %v", err)
			}
			if tc.terms == nil {
				if ops != nil {
					t.Fatalf("patch %+v, want none", ops)
				}
				return
			}
			placed := applyPatch(t, tc.pod, ops)
			if got := requiredTerms(placed); !equality.Semantic.DeepEqual(got, tc.terms) {
				t.Errorf("terms\n%+v\nwant\n%+v", got, tc.terms)
			}
			if !equality.Semantic.DeepEqual(placed.Spec.Tolerations, tc.tolerations) {
				t.Errorf("tolerations\n%+v\nwant\n%+v", placed.Spec.Tolerations, tc.tolerations)
			}
			// Admitted again (a webhook reinvoked): nothing more to do.
			input.pod = placed
			if again, err := place(input); err != nil || again != nil {
				t.Errorf("placing the placed pod again: %+v, %v; want no patch", again, err)
			}
		})
	}
}

// The rest of the pod's affinity and its pod's name from generateName
// come through placement untouched.
func TestPlaceKeepsTheRestOfTheAffinity(t *testing.T) {
	pod := testPod(func(p *corev1.Pod) {
		p.Name, p.GenerateName = "", "web-"
		p.Spec.Affinity = &corev1.Affinity{
			NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
				{Weight: 10, Preference: term(in("disk", "ssd"))}}},
			PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
				{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}},
		}
	})
	in := placementInput{pod: pod, namespace: "shop", offload: offloadOf(v1alpha1.PodsRemote, idA), nodes: placementNodes(), peerLabels: placementPeers}
	ops, err := place(in)
	if err != nil {
		t.Fatal(err)
	}
	placed := applyPatch(t, pod, ops)
	want := pod.Spec.Affinity.DeepCopy()
	want.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term(remoteTo(idA))}}
	if !equality.Semantic.DeepEqual(placed.Spec.Affinity, want) {
		t.Errorf("affinity\n%+v\nwant\n%+v", placed.Spec.Affinity, want)
	}

	in.pod = testPod(func(p *corev1.Pod) { p.Name, p.GenerateName = "", "web-"; p.Spec.NodeName = "local1" })
	_, err = place(in)
	if err == nil || !strings.Contains(err.Error(), "pod shop/web-<generated>") {
		t.Errorf("refusal of a pod named by generateName: %v", err)
	}
}

// A virtual node not registered yet is expected with our labels and its
// Peer's, but not those under Kubernetes' prefixes, nor any that would
// override ours.
func TestExpectedVirtualNode(t *testing.T) {
	n := expectedVirtualNode(v1alpha1.ClusterOffload{ClusterID: idC, ClusterName: "c"},
		map[string]string{"region": "ap", "topology.kubernetes.io/zone": "ap-1", offload.LabelClusterID: "forged"})
	want := map[string]string{"region": "ap", offload.LabelVirtualNode: "true", offload.LabelClusterID: idC, offload.LabelClusterName: "c"}
	if n.Name != offload.VirtualNodeName(idC) {
		t.Errorf("expected node %s, want %s", n.Name, offload.VirtualNodeName(idC))
	}
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("expected node's label %s=%q, want %q (labels %v)", k, n.Labels[k], v, n.Labels)
		}
	}
	if _, ok := n.Labels["topology.kubernetes.io/zone"]; ok {
		t.Errorf("expected node took a Kubernetes label from its Peer: %v", n.Labels)
	}
}
