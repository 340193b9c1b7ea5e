package agent

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
)

func TestBlockOf(t *testing.T) {
	for _, tc := range []struct {
		addr string
		bits int
		want string // "" none
	}{
		{"10.1.2.3", 24, "10.1.2.0/24"},
		{"10.1.2.3", 26, "10.1.2.0/26"},
		{"10.1.2.200", 26, "10.1.2.192/26"},
		{"10.1.2.3", 32, "10.1.2.3/32"},
		{"::ffff:10.1.2.3", 24, "10.1.2.0/24"},
		{"fd00::5", 24, ""}, // the tunnel routes IPv4 only
		{"10.1.2.3", 33, ""},
	} {
		got, ok := blockOf(netip.MustParseAddr(tc.addr), tc.bits)
		if want := tc.want; (want == "") == ok || ok && got != netip.MustParsePrefix(want) {
			t.Errorf("blockOf(%s, %d) = %v, %v; want %q", tc.addr, tc.bits, got, ok, want)
		}
	}
}

// object decodes a manifest as the dynamic informer holds it, through the
// transform.
func object(t testing.TB, manifest string, transform func(any) (any, error)) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal([]byte(manifest), &u.Object); err != nil {
		t.Fatal(err)
	}
	got, err := transform(u)
	if err != nil {
		t.Fatal(err)
	}
	return got.(*unstructured.Unstructured)
}

// Calico's block affinities as its IPAM writes them: only a confirmed
// claim is a node's block.
func TestCalicoBlock(t *testing.T) {
	affinity := func(spec string) string {
		return `{"apiVersion":"crd.projectcalico.org/v1","kind":"BlockAffinity","metadata":{"name":"w1-10-1-2-0-26","annotations":{"big":"x"}},"spec":` + spec + `}`
	}
	for _, tc := range []struct{ name, spec, want string }{
		{"confirmed", `{"cidr":"10.1.2.0/26","node":"w1","state":"confirmed","deleted":"false"}`, "w1 10.1.2.0/26"},
		{"pending", `{"cidr":"10.1.2.0/26","node":"w1","state":"pending","deleted":"false"}`, ""},
		{"pending deletion", `{"cidr":"10.1.2.0/26","node":"w1","state":"pendingDeletion"}`, ""},
		{"deleted", `{"cidr":"10.1.2.0/26","node":"w1","state":"confirmed","deleted":"true"}`, ""},
		{"IPv6", `{"cidr":"fd00:1::/122","node":"w1","state":"confirmed"}`, ""},
		{"not a CIDR", `{"cidr":"10.1.2.0","node":"w1","state":"confirmed"}`, ""},
		{"a number for a CIDR", `{"cidr":7,"node":"w1","state":"confirmed"}`, ""},
		{"host bits", `{"cidr":"10.1.2.5/26","node":"w1","state":"confirmed"}`, "w1 10.1.2.0/26"},
		{"no spec", `null`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := calicoBlock(object(t, affinity(tc.spec), calicoFieldsRead))
			if s := describeBlocks(got); s != tc.want {
				t.Errorf("blocks %q, want %q", s, tc.want)
			}
		})
	}
}

// A CiliumNode's pod blocks (cluster-pool IPAM) are its node's.
func TestCiliumBlocks(t *testing.T) {
	node := func(spec string) string {
		return `{"apiVersion":"cilium.io/v2","kind":"CiliumNode","metadata":{"name":"w2"},"spec":` + spec + `}`
	}
	for _, tc := range []struct{ name, spec, want string }{
		{"one", `{"ipam":{"podCIDRs":["10.0.3.0/24"]}}`, "w2 10.0.3.0/24"},
		{"dual stack", `{"ipam":{"podCIDRs":["10.0.3.0/24","fd00:3::/96"]}}`, "w2 10.0.3.0/24"},
		{"two", `{"ipam":{"podCIDRs":["10.0.3.0/24","10.0.9.0/24"]}}`, "w2 10.0.3.0/24, w2 10.0.9.0/24"},
		{"none yet", `{"ipam":{}}`, ""},
		{"garbage", `{"ipam":{"podCIDRs":["x", "10.0.3.0/24"]}}`, "w2 10.0.3.0/24"},
		{"not a list", `{"ipam":{"podCIDRs":"10.0.3.0/24"}}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ciliumBlocks(object(t, node(tc.spec), ciliumFieldsRead))
			if s := describeBlocks(got); s != tc.want {
				t.Errorf("blocks %q, want %q", s, tc.want)
			}
		})
	}
}

func describeBlocks(bs []nodeBlock) string {
	var s string
	for i, b := range bs {
		if i > 0 {
			s += ", "
		}
		s += b.Node + " " + b.Block.String()
	}
	return s
}

// The informers keep of each object only what is read: identity and the
// fields the blocks come from, never managedFields, annotations or the
// rest of a spec.
func TestCNITransformsKeepOnlyTheFieldsRead(t *testing.T) {
	calico := object(t, `{"apiVersion":"crd.projectcalico.org/v1","kind":"BlockAffinity",
		"metadata":{"name":"a","uid":"u1","resourceVersion":"7","annotations":{"x":"y"},"labels":{"l":"v"},"managedFields":[{"manager":"calico"}]},
		"spec":{"cidr":"10.1.2.0/26","node":"w1","state":"confirmed","deleted":"false","other":"drop me"},"status":{"x":1}}`, calicoFieldsRead)
	want := map[string]any{
		"apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
		"metadata": map[string]any{"name": "a", "uid": "u1", "resourceVersion": "7"},
		"spec":     map[string]any{"cidr": "10.1.2.0/26", "node": "w1", "state": "confirmed", "deleted": "false"},
	}
	if !reflect.DeepEqual(calico.Object, want) {
		t.Errorf("BlockAffinity kept %v, want %v", calico.Object, want)
	}
	cilium := object(t, `{"apiVersion":"cilium.io/v2","kind":"CiliumNode","metadata":{"name":"w2","resourceVersion":"3","managedFields":[{}]},
		"spec":{"addresses":[{"ip":"192.168.1.2","type":"InternalIP"}],"encryption":{},"ipam":{"podCIDRs":["10.0.3.0/24"],"pool":{"10.0.3.7":{}}}},
		"status":{"ipam":{"used":{"10.0.3.7":{"owner":"default/web"}}}}}`, ciliumFieldsRead)
	want = map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
		"metadata": map[string]any{"name": "w2", "resourceVersion": "3"},
		"spec":     map[string]any{"ipam": map[string]any{"podCIDRs": []any{"10.0.3.0/24"}}},
	}
	if !reflect.DeepEqual(cilium.Object, want) {
		t.Errorf("CiliumNode kept %v, want %v", cilium.Object, want)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u2", ResourceVersion: "9", Labels: map[string]string{"app": "web"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:   corev1.PodSpec{NodeName: "w1", Containers: []corev1.Container{{Name: "c", Image: "web"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", PodIPs: []corev1.PodIP{{IP: "10.1.2.3"}}, HostIP: "192.168.1.2"},
	}
	got, err := podFieldsRead(pod)
	if err != nil {
		t.Fatal(err)
	}
	wantPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u2", ResourceVersion: "9"},
		Spec:       corev1.PodSpec{NodeName: "w1"},
		Status:     corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.1.2.3"}}},
	}
	if !reflect.DeepEqual(got, wantPod) {
		t.Errorf("pod kept %+v, want %+v", got, wantPod)
	}
}

// A pod's address stands for its block, unless the pod has the node's
// address (host network) or a provider's (a virtual node).
func TestPodAddressBlocks(t *testing.T) {
	virtualNode := func(n string) bool { return n == "flotilla-b" }
	pod := func(node string, host bool, ips ...string) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: node, HostNetwork: host}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		bits int
		want string
	}{
		{"a pod", pod("w1", false, "10.7.3.9"), 24, "w1 10.7.3.0/24"},
		{"another block size", pod("w1", false, "10.7.3.9"), 26, "w1 10.7.3.0/26"},
		{"dual stack", pod("w1", false, "10.7.3.9", "fd00::9"), 24, "w1 10.7.3.0/24"},
		{"host network", pod("w1", true, "192.168.1.2"), 24, ""},
		{"on a virtual node", pod("flotilla-b", false, "10.70.0.5"), 24, ""},
		{"not scheduled", pod("", false), 24, ""},
		{"no address yet", pod("w1", false), 24, ""},
		{"not an address", pod("w1", false, "x"), 24, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeBlocks(podAddressBlocks(tc.pod, tc.bits, virtualNode)); got != tc.want {
				t.Errorf("blocks %q, want %q", got, tc.want)
			}
		})
	}
}

// The sources in their order: the first that holds a block is the one.
func TestLearnedBlocksSourcePrecedence(t *testing.T) {
	holds := func(s string) func() []nodeBlock {
		return func() []nodeBlock {
			if s == "" {
				return nil
			}
			return []nodeBlock{{Node: "w1", Block: netip.MustParsePrefix(s)}}
		}
	}
	for _, tc := range []struct {
		name                 string
		calico, cilium, pods string
		want                 string
	}{
		{"Calico first", "10.1.0.0/26", "10.2.0.0/24", "10.3.0.0/24", sourceCalico},
		{"Calico served but empty (another IPAM): Cilium", "", "10.2.0.0/24", "10.3.0.0/24", sourceCilium},
		{"then the pods", "", "", "10.3.0.0/24", sourcePods},
		{"none", "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := learnedBlocks{sources: []learnedSource{{sourceCalico, holds(tc.calico)}, {sourceCilium, holds(tc.cilium)}, {sourcePods, holds(tc.pods)}}}
			if got, _ := l.current(); got != tc.want {
				t.Errorf("source %q, want %q", got, tc.want)
			}
		})
	}
	// The Nodes' spec.podCIDRs count beside the learned blocks.
	l := learnedBlocks{sources: []learnedSource{{sourceCalico, holds("10.1.0.0/26")}}}
	blocks, source := podBlocksInUse(fields("10.9.0.0/24"), l)
	if !slices.Equal(blocks, fields("10.9.0.0/24 10.1.0.0/26")) || source != sourceNodes+", "+sourceCalico {
		t.Errorf("blocks %v from %q", blocks, source)
	}
	if blocks, source := podBlocksInUse(nil, learnedBlocks{}); blocks != nil || source != "" {
		t.Errorf("with nothing: blocks %v from %q", blocks, source)
	}
}

// Only a pod range announced by its blocks has the CNI's blocks watched.
func TestLearnsBlocks(t *testing.T) {
	pools := fields("100.64.0.0/11")
	for _, tc := range []struct {
		mode   Announce
		ranges string
		want   bool
	}{
		{AnnounceAuto, "10.0.0.0/8", true},
		{AnnounceAuto, "10.244.0.0/16", false},
		{AnnounceAuto, "10.244.0.0/16 10.0.0.0/8", true},
		{AnnounceBlocks, "10.244.0.0/16", true},
		{AnnounceRange, "10.0.0.0/8", false},
	} {
		if got := learnsBlocks(tc.mode, fields(tc.ranges), pools); got != tc.want {
			t.Errorf("%s %s: %v, want %v", tc.mode, tc.ranges, got, tc.want)
		}
	}
}

// The fabric routes a CNI's block to its node when the node has no
// spec.podCIDRs, and only a block no other node claims or overlaps.
func TestWithLearnedBlocks(t *testing.T) {
	nodes := []fabricapi.Node{
		{Name: "gw", PodCIDRs: fields("10.9.0.0/24")},
		{Name: "w1"},
		{Name: "w2"},
		{Name: "w3"},
	}
	learned := []nodeBlock{
		{"w1", netip.MustParsePrefix("10.1.0.64/26")},
		{"w1", netip.MustParsePrefix("10.1.0.0/26")},
		{"gw", netip.MustParsePrefix("10.1.1.0/26")},   // gw has its spec.podCIDRs
		{"w2", netip.MustParsePrefix("10.2.0.0/24")},   // also w3's: pods of two nodes in one /24
		{"w3", netip.MustParsePrefix("10.2.0.0/24")},   //
		{"w3", netip.MustParsePrefix("10.9.0.128/25")}, // inside gw's block
		{"", netip.MustParsePrefix("10.4.0.0/24")},     // no node
		{"w3", netip.MustParsePrefix("10.3.0.0/24")},
	}
	got := withLearnedBlocks(nodes, learned)
	want := map[string][]netip.Prefix{"gw": nil, "w1": fields("10.1.0.0/26 10.1.0.64/26"), "w2": nil, "w3": fields("10.3.0.0/24")}
	for _, n := range got {
		if !slices.Equal(n.Blocks, want[n.Name]) {
			t.Errorf("node %s: blocks %v, want %v", n.Name, n.Blocks, want[n.Name])
		}
	}
	if nodes[1].Blocks != nil {
		t.Error("the Nodes given were changed")
	}
}

// What a CNI wrote is read without a panic, and every block read is an
// IPv4 block in canonical form.
func FuzzCNIBlocks(f *testing.F) {
	f.Add(`{"metadata":{"name":"w1"},"spec":{"cidr":"10.1.2.0/26","node":"w1","state":"confirmed","ipam":{"podCIDRs":["10.0.3.0/24"]}}}`)
	f.Add(`{"spec":{"cidr":["x"],"ipam":{"podCIDRs":[1,{"a":2}]}}}`)
	f.Add(`{"spec":"x"}`)
	f.Fuzz(func(t *testing.T, manifest string) {
		u := &unstructured.Unstructured{}
		if json.Unmarshal([]byte(manifest), &u.Object) != nil || u.Object == nil {
			return
		}
		var got []nodeBlock
		for _, read := range []struct {
			transform func(any) (any, error)
			read      func(*unstructured.Unstructured) []nodeBlock
		}{{calicoFieldsRead, calicoBlock}, {ciliumFieldsRead, ciliumBlocks}} {
			kept, err := read.transform(u.DeepCopy())
			if err != nil {
				continue
			}
			got = append(got, read.read(kept.(*unstructured.Unstructured))...)
		}
		for _, b := range got {
			if !b.Block.IsValid() || !b.Block.Addr().Is4() || b.Block != b.Block.Masked() {
				t.Fatalf("%s: read %v", manifest, b)
			}
		}
	})
}
