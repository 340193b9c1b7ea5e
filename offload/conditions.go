package offload

import (
	"strings"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// ConditionReady is the condition of each cluster of a NamespaceOffload.
const ConditionReady = "Ready"

// ActingOffload is the NamespaceOffload that acts in its namespace, of
// items (all in one namespace): the oldest not being deleted; nil when
// there is none. The placement webhook follows the same one.
func ActingOffload(items []v1alpha1.NamespaceOffload) *v1alpha1.NamespaceOffload {
	var acting *v1alpha1.NamespaceOffload
	for i := range items {
		o := &items[i]
		if o.DeletionTimestamp == nil && (acting == nil || CompareOffloads(*o, *acting) < 0) {
			acting = o
		}
	}
	return acting
}

func FindCluster(cs []v1alpha1.ClusterOffload, id string) *v1alpha1.ClusterOffload {
	for i := range cs {
		if cs[i].ClusterID == id {
			return &cs[i]
		}
	}
	return nil
}

// CompareOffloads orders a namespace's NamespaceOffloads oldest first,
// then by name.
func CompareOffloads(a, b v1alpha1.NamespaceOffload) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
