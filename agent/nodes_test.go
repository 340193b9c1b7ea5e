package agent

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// A virtual node stands for another cluster: its address (the agent's)
// and the pod block the controller manager may give it are not this
// cluster's, and the fabric does not run there.
func TestClusterNodesLeaveVirtualNodesOut(t *testing.T) {
	node := func(name, addr, block string, labels map[string]string) *corev1.Node {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.NodeSpec{PodCIDRs: []string{block}},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}},
		}
		read, err := nodeFieldsRead(n)
		if err != nil {
			t.Fatal(err)
		}
		return read.(*corev1.Node)
	}
	store := toolscache.NewStore(toolscache.MetaNamespaceKeyFunc)
	for _, n := range []*corev1.Node{
		node("gw", "192.168.1.2", "10.0.0.0/24", map[string]string{"kubernetes.io/os": "linux"}),
		node("flotilla-b", "192.168.1.3", "10.0.1.0/24", map[string]string{v1alpha1.LabelVirtualNode: "true", "region": "a"}),
	} {
		if err := store.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	c := clusterNodes{store}
	if got := c.fabric(); len(got) != 1 || got[0].Name != "gw" {
		t.Errorf("fabric nodes %+v, want gw alone", got)
	}
	if got := c.podBlocks(); len(got) != 1 || got[0] != netip.MustParsePrefix("10.0.0.0/24") {
		t.Errorf("pod blocks %v, want 10.0.0.0/24 alone", got)
	}
	if got := c.addresses(); len(got) != 1 || got[0] != netip.MustParsePrefix("192.168.1.2/32") {
		t.Errorf("node addresses %v, want 192.168.1.2/32 alone", got)
	}
}
