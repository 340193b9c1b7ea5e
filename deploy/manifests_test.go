package deploy

import (
	"slices"
	"testing"
)

// Objects reads every object kustomization.yaml installs, and SharedCRD
// picks exactly the CRDs of APIs other implementations use.
func TestObjectsAndSharedCRDs(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	var shared, own []string
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if SharedCRD(o) {
			shared = append(shared, o.GetName())
		} else {
			own = append(own, o.GetName())
		}
	}
	slices.Sort(shared)
	slices.Sort(own)
	wantShared := []string{"clusterproperties.about.k8s.io", "serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"}
	wantOwn := []string{"namespaceoffloads.flotilla.io", "namespacerequests.flotilla.io", "peers.flotilla.io"}
	if !slices.Equal(shared, wantShared) || !slices.Equal(own, wantOwn) {
		t.Errorf("shared CRDs %v, own %v; want %v and %v", shared, own, wantShared, wantOwn)
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
	}
	for _, k := range []string{"Namespace", "Deployment", "ClusterRole", "ValidatingAdmissionPolicy", "Service"} {
		if !kinds[k] {
			t.Errorf("deploy/ has no %s among %d objects", k, len(objs))
		}
	}
}
