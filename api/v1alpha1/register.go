package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is flotilla.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "flotilla.io", Version: "v1alpha1"}

// AddToScheme registers the types of this package.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Peer{}, &PeerList{}, &NamespaceOffload{}, &NamespaceOffloadList{}, &NamespaceRequest{}, &NamespaceRequestList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
