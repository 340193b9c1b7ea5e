package fabricapi

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// The fabric tolerates every taint but keeps off virtual nodes, which
// stand for other clusters.
func TestDaemonSetKeepsOffVirtualNodes(t *testing.T) {
	owner := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-agent", Namespace: "flotilla-system", UID: "u"}}
	owner.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "flotilla:test"}}
	ds, err := DaemonSet(owner)
	if err != nil {
		t.Fatal(err)
	}
	aff := ds.Spec.Template.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("no required node affinity: %+v", aff)
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		t.Fatalf("node selector terms %+v, want one with one expression", terms)
	}
	e := terms[0].MatchExpressions[0]
	if *e.Key != v1alpha1.LabelVirtualNode || *e.Operator != corev1.NodeSelectorOpDoesNotExist {
		t.Errorf("expression %s %s, want %s DoesNotExist", *e.Key, *e.Operator, v1alpha1.LabelVirtualNode)
	}
}
