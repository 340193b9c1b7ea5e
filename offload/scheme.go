package offload

import (
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func MirrorScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err) // the types are ours: a mistake shows in every test
	}
	return s
}

// MirrorMapper knows where the kinds are served, so neither the cache nor
// the client asks the API server first.
func MirrorMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, networkingv1.SchemeGroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	m.Add(v1alpha1.GroupVersion.WithKind("NamespaceOffload"), meta.RESTScopeNamespace)
	m.Add(v1alpha1.GroupVersion.WithKind("NamespaceRequest"), meta.RESTScopeNamespace)
	m.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	m.Add(networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy"), meta.RESTScopeNamespace)
	return m
}
